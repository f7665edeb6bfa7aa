"""llama.cpp's WordPiece tokenizer ("WPM", `tokenizer.ggml.model` == "bert") over a phantom-space vocabulary.

The rules are llama.cpp's (llm_tokenizer_wpm), not Hugging Face's: each code point is replaced by the first code
point of its NFD form; whitespace ends a word; \\p{C} and \\p{M} code points are dropped; the rest is lowercased
one to one; punctuation, ASCII symbols and CJK ideographs are words of their own. Each word, with '▁' in front,
is split greedily (longest match in bytes, left to right); a word with an unmatched position is one [UNK].
Control-token text ([CLS], [MASK] ...) is parsed as those tokens; [CLS] ... [SEP] wrap the result.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from worker.engine.errors import ModelLoadError
from worker.engine.text.tokenizer import SPM_SPACE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, Tokenizer

# llama.cpp's whitespace set (unicode-data.cpp); \x1c-\x1f, which str.isspace() accepts, are controls there.
WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                        0x202F, 0x205F, 0x3000])
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # llama.cpp's is_chinese_char
_DROP, _SPACE, _ALONE, _JOIN = 0, 1, 2, 3  # what one code point does to the current word


def is_cjk(cpt: int) -> bool:
    """Whether a code point is a CJK ideograph in llama.cpp's (and BERT's) sense."""
    return any(low <= cpt <= high for low, high in CJK_RANGES)


@lru_cache(maxsize=65536)
def _classify(char: str, lowercase: bool) -> tuple[int, str]:
    """What a code point does (drop, end the word, stand alone, join) and the text it contributes; without
    lowercase (tokenizer.ggml.normalizer.lowercase false) accents are kept and case too."""
    cpt = ord(unicodedata.normalize("NFD", char)[0]) if lowercase else ord(char)
    if cpt in WHITESPACE:
        return _SPACE, ""
    first = chr(cpt)
    category = unicodedata.category(first)
    if cpt == 0 or cpt == 0xFFFD or category[0] in "CM":
        return _DROP, ""
    lower = (first.lower()[:1] or first) if lowercase else first
    if category[0] == "P" or (cpt < 0x7F and category[0] == "S") or is_cjk(cpt):
        return _ALONE, lower
    return _JOIN, lower


def split_words(text: str, lowercase: bool = True) -> list[str]:
    """llama.cpp's WPM preprocessing: the words of a text (normalised, lowercased, punctuation alone)."""
    words: list[str] = []
    current: list[str] = []
    for char in text:
        action, piece = _classify(char, lowercase)
        if action == _JOIN:
            current.append(piece)
        elif action == _DROP:
            continue
        else:
            if current:
                words.append("".join(current))
                current = []
            if action == _ALONE:
                words.append(piece)
    if current:
        words.append("".join(current))
    return words


class WordPieceTokenizer(Tokenizer):
    """Text -> ids as llama.cpp's WPM tokenizer does for the same GGUF (decode joins the pieces)."""

    def __init__(self, *, tokens: Sequence[str], token_types: Sequence[int], bos_token_id: int | None,
                 eos_token_id: int | None, unk_token_id: int, add_bos: bool, add_eos: bool,
                 lowercase: bool = True) -> None:
        token_bytes = [text.replace(SPM_SPACE, " ").encode("utf-8") if kind == TOKEN_NORMAL else text.encode("utf-8")
                       for text, kind in zip(tokens, token_types, strict=True)]
        super().__init__(tokens=tokens, token_types=token_types, token_bytes=token_bytes, hf_parse_special=None,
                         hf_plain=None, model_name="bert", pre_tokenizer_name="bert",
                         bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         eog_token_ids=frozenset() if eos_token_id is None else frozenset((eos_token_id,)),
                         add_bos=add_bos, strip_space_prefix=True)
        self.add_eos = add_eos
        self.unk_token_id = unk_token_id
        self.lowercase = lowercase
        self._piece_ids: dict[bytes, int] = {}
        for token_id, (text, kind) in enumerate(zip(tokens, token_types, strict=True)):
            if kind == TOKEN_NORMAL:
                self._piece_ids.setdefault(text.encode("utf-8"), token_id)
        self._longest = max((len(piece) for piece in self._piece_ids), default=1)
        controls = sorted((text for text, kind in zip(tokens, token_types, strict=True)
                           if kind == TOKEN_CONTROL and text), key=len, reverse=True)
        self._control_ids = {text: tokens.index(text) for text in controls}
        self._control_pattern = re.compile("|".join(map(re.escape, controls))) if controls else None

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`: [CLS] and [SEP] around the pieces (as the file says; add_bos=False: neither);
        control-token text is parsed as those tokens unless parse_special is False."""
        wrap = add_bos is None or add_bos
        ids: list[int] = []
        if wrap and (self.add_bos or add_bos) and self.bos_token_id is not None:
            ids.append(self.bos_token_id)
        position = 0
        if parse_special and self._control_pattern is not None:
            for match in self._control_pattern.finditer(text):
                ids.extend(self._encode_plain(text[position : match.start()]))
                ids.append(self._control_ids[match.group()])
                position = match.end()
        ids.extend(self._encode_plain(text[position:]))
        if wrap and self.add_eos and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        """The piece ids of text without control tokens."""
        ids: list[int] = []
        for word in split_words(text, self.lowercase):
            ids.extend(self._encode_word(word))
        return ids

    def _encode_word(self, word: str) -> list[int]:
        """Greedy longest-match pieces of '▁' + word (in bytes); [UNK] alone when some position matches nothing."""
        data = (SPM_SPACE + word).encode("utf-8")
        ids: list[int] = []
        start, n = 0, len(data)
        while start < n:
            for end in range(min(n, start + self._longest), start, -1):
                token_id = self._piece_ids.get(data[start:end])
                if token_id is not None:
                    ids.append(token_id)
                    start = end
                    break
            else:
                return [self.unk_token_id]
        return ids


def wordpiece_from_metadata(metadata: Mapping[str, Any], tokens: list[str], types: list[int],
                            source: str) -> WordPieceTokenizer:
    """The WPM tokenizer of a GGUF whose tokenizer.ggml.model is "bert"."""
    def token_id(key: str, default: int | None) -> int | None:
        value = metadata.get(key, default)
        return value if isinstance(value, int) and 0 <= value < len(tokens) else None

    unk = token_id("tokenizer.ggml.unknown_token_id", types.index(TOKEN_UNKNOWN) if TOKEN_UNKNOWN in types else None)
    if unk is None:
        raise ModelLoadError(source, "a WordPiece vocabulary needs tokenizer.ggml.unknown_token_id")
    return WordPieceTokenizer(
        tokens=tokens, token_types=types,
        bos_token_id=token_id("tokenizer.ggml.bos_token_id", None),
        eos_token_id=token_id("tokenizer.ggml.eos_token_id", token_id("tokenizer.ggml.seperator_token_id", None)),
        unk_token_id=unk,
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", True)),
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", True)),
        lowercase=bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True)),
    )
