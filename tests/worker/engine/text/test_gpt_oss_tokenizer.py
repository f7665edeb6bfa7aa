"""gpt-oss's tokenizer as llama.cpp reads it: the "gpt-4o" pre-tokenizer (llama.cpp's form of o200k's regex), its
end-of-generation tokens (`<|return|>`, `<|call|>`, not `<|end|>`), its message markers rendered as text, and the
bench helper that gives SmolLM2's vocabulary gpt-oss's special tokens (llama-server parity: test_gpt_oss_parity.py)."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Regex, pre_tokenizers

from bench.gpt_oss_tokens import HARMONY_TOKENS, gpt_oss_template, gpt_oss_tokenizer_fields
from tests.worker.engine.text.test_tokenizer import tiny_gpt2_metadata
from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf
from worker.engine.text.pretokenizers import GPT4O_REGEX
from worker.engine.text.tokenizer import TOKEN_CONTROL, TOKEN_USER_DEFINED, IncrementalDetokenizer

# llama.cpp's splits (the same token ids as llama-server's on a SmolLM2 copy with pre "gpt-4o"): a letter that is not
# a-z counts as upper case and one that is not A-Z as lower case, so "ÉCOLE" splits after its É, as llama.cpp does
SPLITS = [
    ("HelloWORLD camelCase XMLHttpRequest", ["Hello", "WORLD", " camel", "Case", " XMLHttp", "Request"]),
    ("it's HELLO'S don'T", ["it's", " HELLO'S", " don'T"]),
    ("12345 1234567", ["123", "45", " ", "123", "456", "7"]),
    ("a/b//c\n\n  x  \r\n", ["a", "/b", "//", "c", "\n\n", " ", " x", "  \r\n"]),
    (" ..!!?? ==>\n", [" ..!!??", " ==>\n"]),
    ("été ÉCOLE Ωmega ǅungla 日本語", ["été", " É", "COLE", " Ωmega", " ǅungla", " 日本語"]),
]


@pytest.mark.parametrize(("text", "pieces"), SPLITS)
def test_the_gpt_4o_split_is_llama_cpps(text: str, pieces: list[str]) -> None:
    split = pre_tokenizers.Split(Regex(GPT4O_REGEX), behavior="isolated")
    assert [piece for piece, _ in split.pre_tokenize_str(text)] == pieces


def _harmony_metadata() -> dict[str, Any]:
    """The tiny byte-level vocabulary with gpt-oss's special tokens (the bench helper's)."""
    return gpt_oss_tokenizer_fields(tiny_gpt2_metadata())


def test_the_bench_helper_gives_gpt_oss_special_tokens() -> None:
    base = tiny_gpt2_metadata()
    fields = _harmony_metadata()
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert set(HARMONY_TOKENS) | {"<|endoftext|>"} <= set(tokens)
    assert all(types[tokens.index(text)] == TOKEN_CONTROL for text in HARMONY_TOKENS)
    assert tokens[tokens.index("<|startoftext|>")] == "<|startoftext|>" and "<|im_start|>" not in tokens  # reused
    assert len(tokens) == len(base["tokenizer.ggml.tokens"]) + len(HARMONY_TOKENS) + 1 - 2  # two slots reused
    assert fields["tokenizer.ggml.pre"] == "gpt-4o" and fields["tokenizer.chat_template"] == gpt_oss_template()
    assert tokens[fields["tokenizer.ggml.eos_token_id"]] == "<|return|>"
    assert tokens[fields["tokenizer.ggml.bos_token_id"]] == "<|startoftext|>"
    assert "<tool>" in tokens and fields["tokenizer.ggml.merges"] == base["tokenizer.ggml.merges"]


def test_the_vocabulary_ends_on_return_and_call_and_renders_the_markers() -> None:
    """llama.cpp's rules: `<|return|>`, `<|call|>` and `<|endoftext|>` end generation, `<|end|>` does not (both of
    the others are there); the markers are user-defined: decoded as text, matched without special parsing."""
    tok = tokenizer_from_gguf(_harmony_metadata())
    ids = {text: tok.encode(text)[0] for text in (*HARMONY_TOKENS, "<|endoftext|>")}
    assert tok.eog_token_ids == {ids["<|return|>"], ids["<|call|>"], ids["<|endoftext|>"]}
    for marker in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"):
        assert tok.token_type(ids[marker]) == TOKEN_USER_DEFINED and not tok.is_special(ids[marker])
        assert tok.encode(marker, parse_special=False) == [ids[marker]]
    assert tok.encode("<|return|>", parse_special=False) != [ids["<|return|>"]]  # still a control token
    reply = "<|channel|>final<|message|>hello world<|end|>"
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.push(i) for i in tok.encode(reply + "<|return|>")) == reply


def test_end_stays_an_end_of_generation_token_without_return_and_call() -> None:
    metadata = tiny_gpt2_metadata()
    metadata["tokenizer.ggml.tokens"] = [*metadata["tokenizer.ggml.tokens"], "<|end|>", "<|channel|>"]
    metadata["tokenizer.ggml.token_type"] = [*metadata["tokenizer.ggml.token_type"], TOKEN_CONTROL, TOKEN_CONTROL]
    tok = tokenizer_from_gguf(metadata)
    end, channel = tok.vocab_size - 2, tok.vocab_size - 1
    assert end in tok.eog_token_ids and tok.is_special(end)
    assert tok.token_type(channel) == TOKEN_USER_DEFINED  # llama.cpp renders it whatever else the vocabulary has
