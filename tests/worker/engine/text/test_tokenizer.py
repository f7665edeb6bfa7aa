"""Tokenizer tests: hand-built gpt2/SPM vocabularies, and llama.cpp's ids for the real SmolLM2 vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.engine.errors import ModelLoadError
from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf
from worker.engine.text.tokenizer import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    IncrementalDetokenizer,
    Tokenizer,
    byte_level_alphabet,
)

# ---------------------------------------------------------------- a tiny gpt2-style byte-level vocabulary


def tiny_gpt2_metadata(pre: str = "gpt2") -> dict[str, Any]:
    """256 byte-level characters, a few merges, two control tokens and one user-defined token."""
    alphabet = byte_level_alphabet()
    tokens = [alphabet[b] for b in range(256)]
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
    for merge in merges:
        tokens.append(merge.replace(" ", ""))
    tokens += ["<|im_start|>", "<|im_end|>", "<tool>"]
    types = [TOKEN_NORMAL] * (len(tokens) - 3) + [TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_USER_DEFINED]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": len(tokens) - 3,
        "tokenizer.ggml.eos_token_id": len(tokens) - 2,
        "tokenizer.ggml.add_bos_token": False,
    }


@pytest.fixture(scope="module")
def tiny_gpt2() -> Tokenizer:
    """Tokenizer over the tiny gpt2-style vocabulary."""
    return tokenizer_from_gguf(tiny_gpt2_metadata())


def test_tiny_gpt2_merges_and_special_tokens(tiny_gpt2: Tokenizer) -> None:
    """Merges apply inside pre-tokenized words; control tokens parse only when asked."""
    tok = tiny_gpt2
    hello, world = tok.token_text(tok.encode("hello world")[0]), tok.token_text(tok.encode("hello world")[1])
    assert (hello, world) == ("hello", "Ġworld")
    im_start, im_end = tok.vocab_size - 3, tok.vocab_size - 2
    assert tok.encode("<|im_start|>hello<|im_end|>") == [im_start, *tok.encode("hello"), im_end]
    plain = tok.encode("<|im_start|>", parse_special=False)
    assert im_start not in plain and tok.decode(plain) == "<|im_start|>"
    assert tok.is_special(im_start) and not tok.is_special(tok.encode("hello")[0])


def test_tiny_gpt2_user_defined_token_is_always_parsed(tiny_gpt2: Tokenizer) -> None:
    """USER_DEFINED tokens match in plain text too, and are not hidden on decode."""
    tool = tiny_gpt2.vocab_size - 1
    assert tool in tiny_gpt2.encode("a<tool>b", parse_special=False)
    assert tiny_gpt2.decode(tiny_gpt2.encode("a<tool>b")) == "a<tool>b"
    assert not tiny_gpt2.is_special(tool)


def test_tiny_gpt2_decode_bytes_and_bos(tiny_gpt2: Tokenizer) -> None:
    """Bytes invert the byte-level map; BOS follows metadata unless overridden."""
    text = "héllo wörld 🙂"
    ids = tiny_gpt2.encode(text)
    assert tiny_gpt2.decode(ids) == text
    assert b"".join(tiny_gpt2.token_bytes(i) for i in ids) == text.encode("utf-8")
    assert tiny_gpt2.encode("hi")[0] != tiny_gpt2.bos_token_id
    assert tiny_gpt2.encode("hi", add_bos=True)[0] == tiny_gpt2.bos_token_id
    assert tiny_gpt2.decode([tiny_gpt2.bos_token_id, *tiny_gpt2.encode("hi")]) == "hi"
    assert tiny_gpt2.decode([tiny_gpt2.bos_token_id], skip_special=False) == "<|im_start|>"
    assert tiny_gpt2.encode("") == []


def test_tiny_gpt2_end_of_generation_ids(tiny_gpt2: Tokenizer) -> None:
    """eos and tokens named like llama.cpp's end-of-generation markers end generation."""
    assert tiny_gpt2.eog_token_ids == frozenset({tiny_gpt2.vocab_size - 2})


def test_an_unknown_pre_tokenizer_is_refused_by_name() -> None:
    """An unknown tokenizer.ggml.pre is refused, as llama.cpp refuses it (its text would be split wrong)."""
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.pre 'no-such-pre' is not supported"):
        tokenizer_from_gguf(tiny_gpt2_metadata(pre="no-such-pre"))


def test_a_missing_pre_tokenizer_is_llama_cpps_default() -> None:
    """No tokenizer.ggml.pre: llama.cpp's `default` split, as llama.cpp does (with its warning)."""
    metadata = tiny_gpt2_metadata(pre="gpt2")
    del metadata["tokenizer.ggml.pre"]
    assert tokenizer_from_gguf(metadata).pre_tokenizer_name == "default"


@pytest.mark.parametrize("pre", ["gpt2", "default", "smollm", "llama3", "llama-bpe", "qwen2", "gpt-4o"])
def test_every_known_pre_tokenizer_round_trips(pre: str) -> None:
    """Each table entry builds and round-trips mixed text exactly."""
    tok = tokenizer_from_gguf(tiny_gpt2_metadata(pre=pre))
    assert tok.pre_tokenizer_name == pre
    text = "Hello world 12345 it's  \n\tdone!? ünï 日本"
    assert tok.decode(tok.encode(text)) == text


def test_bad_metadata_raises_model_load_error() -> None:
    """Missing keys and unsupported tokenizer models give ModelLoadError."""
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.tokens"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(ModelLoadError, match="not supported"):
        tokenizer_from_gguf({**tiny_gpt2_metadata(), "tokenizer.ggml.model": "t5"})


def test_token_id_out_of_range(tiny_gpt2: Tokenizer) -> None:
    """Ids outside the vocabulary are refused with ValueError."""
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_gpt2.token_bytes(tiny_gpt2.vocab_size)


# ---------------------------------------------------------------- a tiny llama/SentencePiece-style vocabulary

SPM_PIECES = [  # (piece, score): merges are derived from these scores (higher merges first)
    ("▁", -100.0), ("h", -100.0), ("e", -100.0), ("l", -100.0), ("o", -100.0), ("w", -100.0),
    ("r", -100.0), ("d", -100.0), ("he", -1.0), ("ll", -2.0), ("llo", -3.0), ("hello", -4.0),
    ("▁hello", -5.0), ("▁w", -6.0), ("or", -7.0), ("ld", -8.0), ("▁wor", -9.0), ("▁world", -10.0),
]  # fmt: skip


def tiny_spm_metadata(add_space_prefix: bool = True) -> dict[str, Any]:
    """<unk>, <s>, </s>, 256 byte tokens, then scored pieces; no merges in the metadata."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [p for p, _ in SPM_PIECES]
    types = (
        [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256 + [TOKEN_NORMAL] * len(SPM_PIECES)
    )
    scores = [0.0] * 259 + [s for _, s in SPM_PIECES]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def test_tiny_spm_merges_from_scores() -> None:
    """Pieces merge by score; a space prefix is added; BOS is on by default for SPM."""
    tok = tokenizer_from_gguf(tiny_spm_metadata())
    ids = tok.encode("hello world")
    assert [tok.token_text(i) for i in ids] == ["<s>", "▁hello", "▁world"]
    assert tok.decode(ids) == "hello world"
    assert tok.token_bytes(ids[1]) == b" hello"


def test_tiny_spm_byte_fallback_and_no_space_prefix() -> None:
    """Characters missing from the vocabulary fall back to <0xNN> byte tokens."""
    tok = tokenizer_from_gguf(tiny_spm_metadata(add_space_prefix=False))
    ids = tok.encode("hé", add_bos=False)
    assert [tok.token_text(i) for i in ids] == ["h", "<0xC3>", "<0xA9>"]
    assert tok.token_bytes(ids[1]) == b"\xc3" and tok.decode(ids) == "hé"
    assert [tok.token_text(i) for i in tok.encode("hello world", add_bos=False)] == ["hello", "▁world"]


def test_tiny_spm_incremental_detokenizer_strips_prefix_at_text_start() -> None:
    """With strip_space_prefix the stream matches decode(); bytes join into one character."""
    tok = tokenizer_from_gguf(tiny_spm_metadata())
    ids = tok.encode("hello é world")
    detok = IncrementalDetokenizer(tok, strip_space_prefix=True)
    pieces = [detok.push(i) for i in ids]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + detok.flush() == tok.decode(ids) == "hello é world"


def test_spm_merges_derived_once_are_kept_for_the_next_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The merges derived from a file's scores are kept beside its repack cache; the next load reads them and
    tokenizes the same; without a cache directory they are derived each time."""
    from worker.engine.formats.derived_cache import derived_path
    from worker.engine.text import gguf_tokenizer

    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setenv("LLMFLEET_REPACK_DIR", str(tmp_path / "repack"))
    first = tokenizer_from_gguf(tiny_spm_metadata(), source=str(source))
    kept = derived_path(source, "spm-merges", ".npy")
    assert kept is not None and kept.is_file()

    def deriving(*_args: Any) -> list[tuple[int, int]]:
        raise AssertionError("kept merges are not derived again")

    monkeypatch.setattr(gguf_tokenizer, "spm_merge_ids", deriving)
    second = tokenizer_from_gguf(tiny_spm_metadata(), source=str(source))
    assert second.encode("hello world") == first.encode("hello world")
    kept.write_bytes(b"not an array")  # unreadable: derived again (and the derivation is what is refused here)
    with pytest.raises(AssertionError, match="not derived again"):
        tokenizer_from_gguf(tiny_spm_metadata(), source=str(source))
    monkeypatch.setenv("LLMFLEET_REPACK_DIR", "")
    assert derived_path(source, "spm-merges") is None


# ---------------------------------------------------------------- the real SmolLM2 vocabulary (llama.cpp's ids)


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf_path: Path) -> Tokenizer:
    """The real SmolLM2 tokenizer, built from the GGUF's metadata once per module."""
    from worker.engine.formats.gguf_file import read_metadata

    return tokenizer_from_gguf(read_metadata(smollm2_gguf_path), source=str(smollm2_gguf_path))


@pytest.mark.slow
def test_smollm2_ids_match_llama_cpp(smollm2_tokenizer: Tokenizer, smollm2_reference: dict[str, Any]) -> None:
    """All fixture texts tokenize to llama.cpp's ids, with and without special-token parsing."""
    cases = smollm2_reference["tokenize"]
    assert len(cases) == 25
    for case in cases:
        assert smollm2_tokenizer.encode(case["text"], parse_special=False) == case["ids"], case["text"]
        assert smollm2_tokenizer.encode(case["text"], parse_special=True) == case["ids_special"], case["text"]


@pytest.mark.slow
def test_smollm2_decode_round_trip(smollm2_tokenizer: Tokenizer, smollm2_reference: dict[str, Any]) -> None:
    """decode(encode(text)) is the text; special tokens are hidden unless asked for."""
    for case in smollm2_reference["tokenize"]:
        assert smollm2_tokenizer.decode(case["ids"]) == case["text"]
        assert smollm2_tokenizer.decode(case["ids_special"], skip_special=False) == case["text"]
    assert smollm2_tokenizer.decode([1, 4093, 198, 6004, 2]) == "user\nhi"


@pytest.mark.slow
def test_smollm2_incremental_detokenizer(
    smollm2_tokenizer: Tokenizer, smollm2_reference: dict[str, Any]
) -> None:
    """Streaming never emits U+FFFD or half a character and concatenates to the full decode."""
    texts = [case["text"] for case in smollm2_reference["tokenize"]]
    texts.append("".join(texts))
    for text in texts:
        for skip_special in (True, False):
            ids = smollm2_tokenizer.encode(text)
            detok = IncrementalDetokenizer(smollm2_tokenizer, skip_special=skip_special)
            pieces = [detok.push(i) for i in ids]
            assert all("\ufffd" not in piece for piece in pieces), text
            assert "".join(pieces) + detok.flush() == smollm2_tokenizer.decode(ids, skip_special=skip_special)


@pytest.mark.slow
def test_smollm2_split_characters_wait_for_their_last_byte(smollm2_tokenizer: Tokenizer) -> None:
    """An emoji split over byte tokens yields nothing until its last byte arrives."""
    ids = smollm2_tokenizer.encode("🙂")
    assert len(ids) > 1
    detok = IncrementalDetokenizer(smollm2_tokenizer)
    assert [detok.push(i) for i in ids] == [""] * (len(ids) - 1) + ["🙂"]
    truncated = IncrementalDetokenizer(smollm2_tokenizer)
    assert truncated.push(ids[0]) == "" and truncated.flush() == "\ufffd"


@pytest.mark.slow
def test_smollm2_special_ids(smollm2_tokenizer: Tokenizer) -> None:
    """bos/eos and the end-of-generation set follow the metadata and llama.cpp's list."""
    tok = smollm2_tokenizer
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id) == (49152, 1, 2)
    assert tok.eog_token_ids == frozenset({0, 2})  # <|endoftext|>, <|im_end|>
    assert tok.pre_tokenizer_name == "smollm" and not tok.add_bos
    assert tok.token_text(2) == "<|im_end|>" and tok.is_special(2)
