"""The batched forward pass: the new tokens of many sequences in one set of matmuls, each over its own cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from worker.engine.architectures import build_weights
from worker.engine.config import ModelConfig
from worker.engine.errors import ContextLengthError
from worker.engine.gguf_file import read_gguf
from worker.engine.kv_cache import SequenceKVCache
from worker.engine.layers import RotaryTable, attend, attend_decode_batch, linear, rms_normalize, swiglu
from worker.engine.weights import TransformerWeights

OutputKind = Literal["last", "all", "hidden", "none"]


@dataclass
class BatchEntry:
    """One sequence's part of a forward step: its new tokens, its cache, and what it wants back."""

    tokens: np.ndarray  # (T,) int token ids, appended at positions cache.length ...
    cache: SequenceKVCache
    output: OutputKind = "last"


class Model:
    """A loaded model: config, weights and rotary tables; stateless across sequences."""

    def __init__(self, config: ModelConfig, weights: TransformerWeights, metadata: dict | None = None) -> None:
        self.config = config
        self.weights = weights
        self.metadata = metadata or {}
        self.rotary = RotaryTable(config.rope_dim, config.rope_base, config.context_length)

    @classmethod
    def from_file(cls, path: str | Path) -> Model:
        """Load a GGUF file (dequantized to float32 once)."""
        contents = read_gguf(path)
        config = ModelConfig.from_metadata(contents.metadata, str(path))
        weights = build_weights(contents.tensors, config, str(path))
        return cls(config, weights, contents.metadata)

    def new_cache(self, capacity: int = 0) -> SequenceKVCache:
        """An empty KV cache for one sequence."""
        return SequenceKVCache(self.config, capacity)

    def forward(self, batch: list[BatchEntry]) -> list[np.ndarray | None]:
        """Run one step over a batch; returns per entry last logits (V,), all logits (T, V), hidden (T, D) or None."""
        cfg = self.config
        lengths = [len(entry.tokens) for entry in batch]
        for entry, n in zip(batch, lengths):
            if entry.cache.length + n > cfg.context_length:
                raise ContextLengthError(
                    f"{entry.cache.length + n} tokens exceed the context length {cfg.context_length}")
            entry.cache.reserve(entry.cache.length + n)
        tokens = np.concatenate([np.asarray(e.tokens, dtype=np.int64) for e in batch])  # (N,)
        positions = np.concatenate([np.arange(e.cache.length, e.cache.length + n) for e, n in zip(batch, lengths)])  # (N,)
        starts = np.concatenate([[0], np.cumsum(lengths)])  # (B+1,)
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        pasts = [e.cache.length for e in batch]
        single = [bi for bi, n in enumerate(lengths) if n == 1]
        single_rows = np.array([starts[bi] for bi in single], dtype=np.int64)  # (B1,)
        multi = [bi for bi, n in enumerate(lengths) if n > 1]
        cos, sin = self.rotary.angles(positions)  # (N, 1, R/2) x2
        x = self.weights.token_embedding[tokens]  # (N, D)
        for li, layer in enumerate(self.weights.layers):
            qkv = np.ascontiguousarray(linear(rms_normalize(x, cfg.rms_eps), layer.wqkv))  # (N, H*Dh + 2*Hkv*Dh)
            if layer.bqkv is not None:
                qkv += layer.bqkv
            qk = qkv[:, : q_dim + kv_dim].reshape(-1, cfg.n_heads + cfg.n_kv_heads, cfg.head_dim)  # (N, H+Hkv, Dh)
            self.rotary.apply(qk, cos, sin)
            q = qk[:, : cfg.n_heads]  # (N, H, Dh)
            k = qk[:, cfg.n_heads :]  # (N, Hkv, Dh)
            v = qkv[:, q_dim + kv_dim :].reshape(-1, cfg.n_kv_heads, cfg.head_dim)  # (N, Hkv, Dh)
            attn = np.empty((len(tokens), q_dim), np.float32)  # (N, H*Dh)
            if single:  # entries with one new token: one batched softmax over all of them
                for bi, row in zip(single, single_rows):
                    cache = batch[bi].cache
                    cache.keys[li, :, pasts[bi]] = k[row]  # (Hkv, Dh)
                    cache.values[li, :, pasts[bi]] = v[row]  # (Hkv, Dh)
                if len(single) == 1:  # one stream: plain attention, no padded batch
                    bi, row = single[0], int(single_rows[0])
                    attn[row : row + 1] = attend(q[row : row + 1], batch[bi].cache.keys[li, :, : pasts[bi] + 1],
                                                 batch[bi].cache.values[li, :, : pasts[bi] + 1], pasts[bi])  # (1, H*Dh)
                else:
                    attn[single_rows] = attend_decode_batch(
                        q[single_rows],
                        [batch[bi].cache.keys[li, :, : pasts[bi] + 1] for bi in single],
                        [batch[bi].cache.values[li, :, : pasts[bi] + 1] for bi in single],
                    )  # (B1, H*Dh)
            for bi in multi:  # prefill chunks: causal attention per sequence
                s, e = starts[bi], starts[bi + 1]
                cache, past = batch[bi].cache, pasts[bi]
                cache.keys[li, :, past : past + e - s] = k[s:e].transpose(1, 0, 2)  # (Hkv, T, Dh)
                cache.values[li, :, past : past + e - s] = v[s:e].transpose(1, 0, 2)  # (Hkv, T, Dh)
                attn[s:e] = attend(q[s:e], cache.keys[li, :, : past + e - s],
                                   cache.values[li, :, : past + e - s], past)  # (T, H*Dh)
            x += linear(attn, layer.wo)  # (N, D)
            x += linear(swiglu(linear(rms_normalize(x, cfg.rms_eps), layer.w_gate_up)), layer.w_down)  # (N, D)
        for entry, n in zip(batch, lengths):
            entry.cache.length += n
        return self._outputs(batch, x, starts)

    def _outputs(self, batch: list[BatchEntry], x: np.ndarray, starts: np.ndarray) -> list[np.ndarray | None]:
        """Final norm and output projection, only for the rows each entry asked for."""
        spans: list[tuple[int, int]] = []
        for bi, entry in enumerate(batch):
            end = int(starts[bi + 1])
            first = end - 1 if entry.output == "last" else int(starts[bi])
            spans.append((first, end) if entry.output != "none" else (end, end))
        index = np.concatenate([np.arange(a, b) for a, b in spans])  # (M,)
        hidden = rms_normalize(x[index], self.config.rms_eps) * self.weights.output_norm  # (M, D)
        logit_rows = np.concatenate(
            [np.full(b - a, e.output in ("last", "all")) for (a, b), e in zip(spans, batch)])  # (M,)
        logits = np.ascontiguousarray(linear(hidden[logit_rows], self.weights.output))  # (M', V)
        results: list[np.ndarray | None] = []
        offset = logit_offset = 0
        for (a, b), entry in zip(spans, batch):
            n = b - a
            if entry.output == "hidden":
                results.append(hidden[offset : offset + n])  # (T, D)
            elif entry.output == "last":
                results.append(logits[logit_offset])  # (V,)
            elif entry.output == "all":
                results.append(logits[logit_offset : logit_offset + n])  # (T, V)
            else:
                results.append(None)
            offset += n
            logit_offset += n if entry.output in ("last", "all") else 0
        return results
