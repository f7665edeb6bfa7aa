"""The tokenizer: text to ids and back over gpt2-style byte-level BPE or llama/SentencePiece-style BPE (WordPiece
is worker.engine.text.wordpiece; building one from a GGUF file's metadata is worker.engine.text.gguf_tokenizer)."""

from __future__ import annotations

import codecs
import logging
import re
from collections.abc import Iterable, Sequence

import tokenizers

logger = logging.getLogger(__name__)

# llama.cpp's token types (gguf TokenType).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

SPM_SPACE = "\u2581"  # '▁', SentencePiece's visible space
BYTE_TOKEN_PATTERN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

# Token texts that end generation besides eos/eot, as llama.cpp's vocabulary loader lists them.
EOG_TOKEN_TEXTS = frozenset(
    ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>")
    + ("<EOT>", "_<EOT>", "<|return|>", "<|call|>")  # the last two: gpt-oss (o200k_harmony)
)
# gpt-oss's message markers, which llama.cpp always renders as text (it makes them user-defined tokens) so that a
# reply's harmony structure reaches the parser; `<|end|>` joins them, and leaves the end-of-generation set, in a
# vocabulary that also has `<|return|>` and `<|call|>` (there `<|end|>` closes a message, not the reply).
RENDERED_MARKER_TEXTS = frozenset(("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"))
HARMONY_END, HARMONY_EOG = "<|end|>", frozenset(("<|return|>", "<|call|>"))

def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable unicode character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_OF_CHAR: dict[str, int] = {char: byte for byte, char in byte_level_alphabet().items()}


def _byte_level_bytes(text: str) -> bytes:
    """Invert the byte-level alphabet; characters outside it stand for their own UTF-8."""
    out = bytearray()
    for char in text:
        byte = BYTE_OF_CHAR.get(char)
        if byte is None:
            out += char.encode("utf-8")
        else:
            out.append(byte)
    return bytes(out)


def _verbatim_bytes(text: str, token_type: int) -> bytes:
    """Control and user-defined tokens stand for their own text; unused ones for nothing."""
    return b"" if token_type == TOKEN_UNUSED else text.encode("utf-8")


def _spm_bytes(text: str, token_type: int) -> bytes:
    """Bytes of a SentencePiece-style token: '<0xNN>' byte tokens, '▁' for space."""
    if token_type == TOKEN_BYTE:
        match = BYTE_TOKEN_PATTERN.match(text)
        if match:
            return bytes([int(match.group(1), 16)])
    return text.replace(SPM_SPACE, " ").encode("utf-8")


def spm_merge_ids(tokens: Sequence[str], scores: Sequence[float], mergeable: Sequence[bool]) -> list[tuple[int, int]]:
    """BPE merges derived from a scored vocabulary, as HF's SentencePieceExtractor does: (left id, right id) pairs,
    best-scored merge first (ties by the halves' ids)."""
    token_id = {text: i for i, text in reversed(list(enumerate(tokens))) if mergeable[i]}
    ranked: list[tuple[float, int, int]] = []
    for merged_id, merged in enumerate(tokens):
        if not mergeable[merged_id] or len(merged) < 2:
            continue
        for cut in range(1, len(merged)):
            left_id = token_id.get(merged[:cut])
            if left_id is not None and (right_id := token_id.get(merged[cut:])) is not None:
                ranked.append((-float(scores[merged_id]), left_id, right_id))
    ranked.sort()
    return [(left, right) for _, left, right in ranked]


class Tokenizer:
    """Text <-> token ids for one model, matching llama.cpp's tokenizer for the same GGUF."""

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        token_types: Sequence[int],
        token_bytes: Sequence[bytes],
        hf_parse_special: tokenizers.Tokenizer | None,
        hf_plain: tokenizers.Tokenizer | None,
        model_name: str,
        pre_tokenizer_name: str,
        bos_token_id: int | None,
        eos_token_id: int | None,
        eog_token_ids: frozenset[int],
        add_bos: bool,
        strip_space_prefix: bool,
    ) -> None:
        self._tokens = list(tokens)
        self._token_types = list(token_types)
        self._token_bytes = list(token_bytes)
        self._hf_parse_special = hf_parse_special
        self._hf_plain = hf_plain
        self.model_name = model_name
        self.pre_tokenizer_name = pre_tokenizer_name
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.eog_token_ids = eog_token_ids
        self.add_bos = add_bos
        self.strip_space_prefix = strip_space_prefix
        self._special = [t in (TOKEN_CONTROL, TOKEN_UNKNOWN) for t in self._token_types]
        for special_id in (bos_token_id, eos_token_id):
            if special_id is not None:
                self._special[special_id] = True

    @property
    def vocab_size(self) -> int:
        """Number of token ids (the model's logit width)."""
        return len(self._tokens)

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; parse_special=False reads control-token text as plain text."""
        hf = self._hf_parse_special if parse_special else self._hf_plain
        ids = hf.encode(text, add_special_tokens=False).ids if text else []
        want_bos = self.add_bos if add_bos is None else add_bos
        if want_bos and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return list(ids)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of a whole id sequence; invalid UTF-8 becomes U+FFFD."""
        pieces = [self.token_bytes(i) for i in ids if not (skip_special and self.is_special(i))]
        first = next((index for index, piece in enumerate(pieces) if piece), None)
        if self.strip_space_prefix and first is not None and pieces[first].startswith(b" "):
            pieces[first] = pieces[first][1:]  # the space SPM put in front of the text
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (special tokens: their text)."""
        self._check_id(token_id)
        return self._token_bytes[token_id]

    def token_text(self, token_id: int) -> str:
        """The token's string as stored in the vocabulary (e.g. 'Ġworld', '▁world', '<|im_end|>')."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """Whether the token is a control token (bos, eos, chat markers), hidden by default on decode."""
        self._check_id(token_id)
        return self._special[token_id]

    def token_type(self, token_id: int) -> int:
        """llama.cpp's token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)."""
        self._check_id(token_id)
        return self._token_types[token_id]

    def _check_id(self, token_id: int) -> None:
        """Refuse ids outside the vocabulary with a clear message."""
        if not 0 <= token_id < len(self._tokens):
            raise ValueError(f"token id {token_id} is outside the vocabulary (size {len(self._tokens)})")


class IncrementalDetokenizer:
    """Turns a stream of token ids into text without ever emitting half a UTF-8 character."""

    def __init__(
        self, tokenizer: Tokenizer, *, skip_special: bool = True, strip_space_prefix: bool = False
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._strip_space_prefix = strip_space_prefix  # True only when the stream starts a text
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._started = False

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        piece = self._tokenizer.token_bytes(token_id)
        if not self._started and piece:
            self._started = True
            if self._strip_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """Release bytes still held at the end (an incomplete character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)
