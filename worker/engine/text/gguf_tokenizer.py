"""Building a Tokenizer from a GGUF file's `tokenizer.ggml.*` keys: gpt2 (byte-level BPE), llama
(SentencePiece-style BPE) and bert (WordPiece, worker.engine.text.wordpiece)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers

from worker.engine.errors import ModelLoadError
from worker.engine.formats.derived_cache import derived_array
from worker.engine.text.pretokenizers import PRE_TOKENIZERS, byte_level_pre_tokenizer
from worker.engine.text.tokenizer import (
    EOG_TOKEN_TEXTS,
    HARMONY_END,
    HARMONY_EOG,
    RENDERED_MARKER_TEXTS,
    SPM_SPACE,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    Tokenizer,
    _byte_level_bytes,
    _spm_bytes,
    _verbatim_bytes,
    spm_merge_ids,
)
from worker.engine.text.wordpiece import wordpiece_from_metadata

logger = logging.getLogger(__name__)


def _require(metadata: Mapping[str, Any], key: str, source: str) -> Any:
    """Fetch a mandatory metadata key or fail with ModelLoadError."""
    if key not in metadata:
        raise ModelLoadError(source, f"metadata has no {key!r}")
    return metadata[key]


def _optional_id(metadata: Mapping[str, Any], key: str, vocab_size: int) -> int | None:
    """An optional token-id key, dropped when absent or out of range."""
    value = metadata.get(key)
    if isinstance(value, int) and 0 <= value < vocab_size:
        return value
    return None


@dataclass
class _ModelParts:
    """The pieces that differ between gpt2-style and llama-style vocabularies."""

    bpe: models.BPE
    normalizer: normalizers.Normalizer | None
    pre_tokenizer: pre_tokenizers.PreTokenizer | None
    decoder: decoders.Decoder
    token_bytes: list[bytes]
    default_add_bos: bool
    add_space_prefix: bool = False
    pre_name: str = ""


def _split_merges(raw_merges: Sequence[str], source: str) -> list[tuple[str, str]]:
    """Parse GGUF merges ('left right' strings) into pairs."""
    pairs = [merge.split(" ", 1) for merge in raw_merges]
    if any(len(pair) != 2 for pair in pairs):
        raise ModelLoadError(source, "tokenizer.ggml.merges has an entry without a space")
    return [(left, right) for left, right in pairs]


def _gpt2_parts(metadata: Mapping[str, Any], source: str, tokens: list[str], types: list[int]) -> _ModelParts:
    """Byte-level BPE with the pre-tokenizer named by tokenizer.ggml.pre."""
    pre_name = str(metadata.get("tokenizer.ggml.pre") or "default")  # none named: llama.cpp's default, as it does
    if pre_name not in PRE_TOKENIZERS:  # llama.cpp refuses an unknown one too: its pieces would be split wrong
        raise ModelLoadError(source, f"tokenizer.ggml.pre {pre_name!r} is not supported (supported: "
                                     f"{', '.join(sorted(PRE_TOKENIZERS))})")
    spec = PRE_TOKENIZERS[pre_name]
    merges = _split_merges(metadata.get("tokenizer.ggml.merges") or [], source)
    return _ModelParts(
        bpe=models.BPE(_vocab_of(tokens), merges, ignore_merges=spec.ignore_merges),
        normalizer=None,
        pre_tokenizer=byte_level_pre_tokenizer(spec),
        decoder=decoders.ByteLevel(),
        token_bytes=[
            _byte_level_bytes(text) if kind == TOKEN_NORMAL else _verbatim_bytes(text, kind)
            for text, kind in zip(tokens, types, strict=True)
        ],
        default_add_bos=False,
        pre_name=pre_name,
    )


def _llama_parts(
    metadata: Mapping[str, Any], source: str, tokens: list[str], types: list[int]
) -> _ModelParts:
    """SentencePiece-style BPE: merges from scores, byte fallback, '▁' for space."""
    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    raw_merges = metadata.get("tokenizer.ggml.merges")
    if raw_merges:
        merges = _split_merges(raw_merges, source)
    else:
        scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        merge_ids = derived_array(  # seconds for a 262k vocabulary (Gemma 3): kept for the next start
            source, "spm-merges",
            lambda: np.asarray(spm_merge_ids(tokens, scores, [kind == TOKEN_NORMAL for kind in types]),
                               np.int32).reshape(-1, 2),  # (M, 2) left and right token ids
            valid=lambda ids: ids.dtype == np.int32 and ids.ndim == 2 and ids.shape[1] == 2
            and (ids.size == 0 or (int(ids.min()) >= 0 and int(ids.max()) < len(tokens))))
        merges = [(tokens[left], tokens[right]) for left, right in merge_ids.tolist()]
    unk_id = _optional_id(metadata, "tokenizer.ggml.unknown_token_id", len(tokens))
    if unk_id is None and TOKEN_UNKNOWN in types:
        unk_id = types.index(TOKEN_UNKNOWN)
    unk_token = tokens[unk_id] if unk_id is not None else None
    replace_space = normalizers.Replace(" ", SPM_SPACE)
    return _ModelParts(
        bpe=models.BPE(_vocab_of(tokens), merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True),
        normalizer=(
            normalizers.Sequence([normalizers.Prepend(SPM_SPACE), replace_space])
            if add_space_prefix
            else replace_space
        ),
        pre_tokenizer=None,
        decoder=decoders.ByteFallback(),
        token_bytes=[
            _spm_bytes(text, kind) if kind in (TOKEN_NORMAL, TOKEN_BYTE) else _verbatim_bytes(text, kind)
            for text, kind in zip(tokens, types, strict=True)
        ],
        default_add_bos=True,
        add_space_prefix=add_space_prefix,
    )


def _vocab_of(tokens: Sequence[str]) -> dict[str, int]:
    """Token text -> id; a duplicated text keeps its first id."""
    vocab: dict[str, int] = {}
    for token_id, text in enumerate(tokens):
        vocab.setdefault(text, token_id)
    return vocab


def _end_of_generation_ids(
    metadata: Mapping[str, Any], tokens: Sequence[str], eos_id: int | None
) -> frozenset[int]:
    """eos, eot and eom ids plus every token named like llama.cpp's end-of-generation markers."""
    eog = {eos_id} if eos_id is not None else set()
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        token_id = _optional_id(metadata, key, len(tokens))
        if token_id is not None:
            eog.add(token_id)
    eog.update(i for i, text in enumerate(tokens) if text in EOG_TOKEN_TEXTS)
    return frozenset(eog)


def _rendered_markers(tokens: Sequence[str], types: list[int], eog: frozenset[int]) -> tuple[list[int], frozenset[int]]:
    """llama.cpp's gpt-oss rules: its message markers become user-defined tokens (rendered as text, matched even
    without special-token parsing), and so does `<|end|>`, leaving the end-of-generation set, where that set also
    holds `<|return|>` and `<|call|>`."""
    types = [TOKEN_USER_DEFINED if text in RENDERED_MARKER_TEXTS else kind for text, kind in zip(tokens, types, strict=True)]
    texts = {tokens[i] for i in eog}
    if texts >= HARMONY_EOG and HARMONY_END in texts:
        ends = {i for i in eog if tokens[i] == HARMONY_END}
        types = [TOKEN_USER_DEFINED if i in ends else kind for i, kind in enumerate(types)]
        eog = eog - ends
    return types, eog


def _hf_tokenizer(parts: _ModelParts, tokens: list[str], types: list[int], *,
                  encode_special_text: bool) -> tokenizers.Tokenizer:
    """One HF tokenizer over the vocabulary's parts, its control tokens special and its user-defined ones added;
    encode_special_text=True reads control-token text as plain text."""
    hf = tokenizers.Tokenizer(parts.bpe)
    if parts.normalizer is not None:
        hf.normalizer = parts.normalizer
    if parts.pre_tokenizer is not None:
        hf.pre_tokenizer = parts.pre_tokenizer
    hf.decoder = parts.decoder
    hf.add_special_tokens([AddedToken(text, special=True, normalized=False)
                          for text, kind in zip(tokens, types, strict=True) if kind == TOKEN_CONTROL and text])
    hf.add_tokens([AddedToken(text, special=False, normalized=False)
                   for text, kind in zip(tokens, types, strict=True) if kind == TOKEN_USER_DEFINED and text])
    hf.encode_special_tokens = encode_special_text
    return hf


def tokenizer_from_gguf(metadata: Mapping[str, Any], *, source: str = "GGUF metadata") -> Tokenizer:
    """Build the tokenizer a GGUF file's `tokenizer.ggml.*` keys describe (for gpt2 and llama: two HF instances
    plus byte tables)."""
    model_name = str(_require(metadata, "tokenizer.ggml.model", source))
    tokens = [str(t) for t in _require(metadata, "tokenizer.ggml.tokens", source)]
    if not tokens:
        raise ModelLoadError(source, "tokenizer.ggml.tokens is empty")
    types = [int(t) for t in metadata.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)]
    if len(types) != len(tokens):
        raise ModelLoadError(source, f"{len(types)} token types for {len(tokens)} tokens")
    if model_name == "bert":
        return wordpiece_from_metadata(metadata, tokens, types, source)
    bos_id = _optional_id(metadata, "tokenizer.ggml.bos_token_id", len(tokens))
    eos_id = _optional_id(metadata, "tokenizer.ggml.eos_token_id", len(tokens))
    types, eog = _rendered_markers(tokens, types, _end_of_generation_ids(metadata, tokens, eos_id))
    if model_name == "gpt2":
        parts = _gpt2_parts(metadata, source, tokens, types)
    elif model_name == "llama":
        parts = _llama_parts(metadata, source, tokens, types)
    else:
        raise ModelLoadError(
            source, f"tokenizer model {model_name!r} is not supported (only 'gpt2', 'llama' and 'bert')"
        )

    return Tokenizer(
        tokens=tokens,
        token_types=types,
        token_bytes=parts.token_bytes,
        hf_parse_special=_hf_tokenizer(parts, tokens, types, encode_special_text=False),
        hf_plain=_hf_tokenizer(parts, tokens, types, encode_special_text=True),
        model_name=model_name,
        pre_tokenizer_name=parts.pre_name,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        eog_token_ids=eog,
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", parts.default_add_bos)),
        strip_space_prefix=parts.add_space_prefix,
    )
