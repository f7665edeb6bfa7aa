"""llama.cpp's WordPiece (WPM) tokenizer: its rules on a small vocabulary, and llama.cpp's exact ids for MiniLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf
from worker.engine.text.tokenizer import TOKEN_CONTROL, TOKEN_NORMAL
from worker.engine.text.wordpiece import WordPieceTokenizer, split_words

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PIECES = ["▁hello", "▁world", "▁,", "▁!", "▁cafe", "▁un", "able", "▁ᄒ", "▁中", "▁文", "▁a", "b", "▁$", "▁x", "x"]


def small_tokenizer() -> WordPieceTokenizer:
    """A WPM tokenizer over five control tokens and a few phantom-space pieces."""
    tokens = SPECIALS + PIECES
    return WordPieceTokenizer(tokens=tokens, token_types=[TOKEN_CONTROL] * 5 + [TOKEN_NORMAL] * len(PIECES),
                              bos_token_id=2, eos_token_id=3, unk_token_id=1, add_bos=True, add_eos=True)


def ids_of(*texts: str) -> list[int]:
    """Token ids of vocabulary texts."""
    vocab = SPECIALS + PIECES
    return [vocab.index(t) for t in texts]


def test_words_follow_llama_cpp_rules() -> None:
    assert split_words("Hello,World!") == ["hello", ",", "world", "!"]
    assert split_words("Café naïve") == ["cafe", "naive"]  # NFD's first code point: accents go
    assert split_words("한") == ["ᄒ"]  # a Hangul syllable keeps only its leading jamo
    assert split_words("a\u200db\u00ad c") == ["ab", "c"]  # format characters (\\p{C}) are dropped
    assert split_words("कि") == ["क"]  # a spacing mark (Mc) is dropped too
    assert split_words("中文x") == ["中", "文", "x"]  # CJK ideographs stand alone
    assert split_words("a$b€c") == ["a", "$", "b€c"]  # ASCII symbols stand alone, others join the word
    assert split_words(" \t\n ") == []


def test_greedy_longest_match_and_unknown_words() -> None:
    tok = small_tokenizer()
    assert tok.encode("Hello, world!") == ids_of("[CLS]", "▁hello", "▁,", "▁world", "▁!", "[SEP]")
    assert tok.encode("unable") == ids_of("[CLS]", "▁un", "able", "[SEP]")
    assert tok.encode("unablez hello") == ids_of("[CLS]", "[UNK]", "▁hello", "[SEP]")  # the whole word is [UNK]
    assert tok.encode("x" * 300) == ids_of("[CLS]", "▁x", *["x"] * 299, "[SEP]")  # no word-length limit
    assert tok.encode("") == tok.encode(" ") == ids_of("[CLS]", "[SEP]")


def test_control_token_text_is_parsed_as_special() -> None:
    tok = small_tokenizer()
    assert tok.encode("hello [MASK] world") == ids_of("[CLS]", "▁hello", "[MASK]", "▁world", "[SEP]")
    # read as text: "[", "mask", "]" are three words, none in this vocabulary
    assert tok.encode("[MASK]", parse_special=False) == ids_of("[CLS]", "[UNK]", "[UNK]", "[UNK]", "[SEP]")
    assert tok.decode(tok.encode("Hello, world!")) == "hello , world !"


@pytest.mark.slow
def test_ids_match_llama_cpp_for_every_fixture_text(minilm_f32_path: Path, minilm_reference: dict[str, Any]) -> None:
    from worker.engine.formats.gguf_file import read_metadata

    tok = tokenizer_from_gguf(read_metadata(minilm_f32_path))
    assert isinstance(tok, WordPieceTokenizer)
    for entry in minilm_reference["texts"]:
        assert tok.encode(entry["text"]) == entry["ids"], entry["text"][:60]
    assert max(len(e["ids"]) for e in minilm_reference["texts"]) == 567  # the long text was checked in full
