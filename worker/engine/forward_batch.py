"""One forward step's batch description: tokens, positions, sequence spans and block tables, plus attention.

Built once per step; architecture blocks call `attention()` per layer. Decode rows (one new token each) are
attended together with a constant number of array calls per layer; prefill chunks are attended per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from worker.engine import ops
from worker.engine.kv_pool import KVPool
from worker.engine.ops import Array, RotaryTable

OutputKind = Literal["last", "all", "hidden", "none"]


@dataclass
class BatchEntry:
    """One sequence's part of a step: new tokens at positions start.., in the pool under seq_id."""

    seq_id: int
    tokens: Array  # (T,) int token ids
    start: int  # position of tokens[0]: the sequence's tokens already in the pool
    output: OutputKind = "last"


class ForwardBatch:
    """Everything a step's layers need that does not depend on the layer: positions, slots, tables, masks."""

    def __init__(self, entries: list[BatchEntry], pool: KVPool) -> None:
        self.entries = entries
        self.pool = pool
        lengths = [len(e.tokens) for e in entries]
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (B+1,)
        self.tokens = ops.asarray(np.concatenate([np.asarray(e.tokens, np.int64) for e in entries]))  # (N,)
        positions = np.concatenate([np.arange(e.start, e.start + n) for e, n in zip(entries, lengths)])  # (N,)
        self.positions = ops.asarray(positions.astype(np.int64))  # (N,)
        tables = [np.asarray(pool.blocks.block_table(e.seq_id), np.int64) for e in entries]
        blocks = np.concatenate([t[(p // pool.block_size)] for t, p in
                                 zip(tables, np.split(positions, self.starts[1:-1]))])  # (N,)
        self.write_blocks = ops.asarray(blocks)  # (N,)
        self.write_offsets = ops.asarray(positions % pool.block_size)  # (N,)
        decode = [i for i, n in enumerate(lengths) if n == 1]
        self.all_decode = len(decode) == len(entries)  # rows are the decode rows in order: no gather/scatter
        self.decode_rows = ops.asarray(self.starts[decode])  # (B1,)
        self.prefill = [(i, int(self.starts[i]), int(self.starts[i + 1]), ops.asarray(tables[i]))
                        for i, n in enumerate(lengths) if n > 1]
        self._decode_lengths = np.array([entries[i].start + 1 for i in decode], np.int64)  # (B1,)
        self._decode_tables = None
        if decode:
            width = int(-(-self._decode_lengths.max() // pool.block_size))
            padded = np.zeros((len(decode), width), np.int64)  # (B1, nb) block 0 pads: finite, masked out
            for row, i in enumerate(decode):
                used = tables[i][:width]
                padded[row, : len(used)] = used
            self._decode_tables = ops.asarray(padded)  # (B1, nb)
        self._masks: dict[int, Array] = {}
        self._angles: dict[int, tuple[Array, Array]] = {}

    @property
    def n_tokens(self) -> int:
        """Tokens in the step."""
        return int(self.starts[-1])

    def rope_angles(self, rotary: RotaryTable) -> tuple[Array, Array]:
        """Cosines and sines of this step's positions for one rotary table, computed once per step."""
        angles = self._angles.get(id(rotary))
        if angles is None:
            angles = self._angles[id(rotary)] = rotary.angles(self.positions)  # (N, 1, R/2) x2
        return angles

    def _decode_mask(self, window: int) -> Array:
        """Additive (B1, L) mask of the decode rows: -inf past each length (and before its window)."""
        mask = self._masks.get(window)
        if mask is None:
            width = self._decode_tables.shape[1] * self.pool.block_size
            key_pos = np.arange(width)[None, :]  # (1, L)
            lengths = self._decode_lengths[:, None]  # (B1, 1)
            hidden = key_pos >= lengths  # (B1, L)
            if window > 0:
                hidden |= key_pos <= lengths - 1 - window  # (B1, L)
            mask = ops.asarray(np.where(hidden, -np.inf, 0.0).astype(np.float32))  # (B1, L)
            self._masks[window] = mask
        return mask

    def attention(self, layer: int, q: Array, k: Array, v: Array, *, window: int = 0) -> Array:
        """Store this step's k, v (N, Hkv, Dh) in the pool, then attend q (N, H, Dh) for every row: (N, H*Dh)."""
        pool = self.pool
        pool.write(layer, self.write_blocks, self.write_offsets, k, v)
        n, n_heads, head_dim = q.shape
        out = ops.empty((n, n_heads * head_dim))  # (N, H*Dh)
        if self._decode_tables is not None:
            keys, values = pool.gather(layer, self._decode_tables)  # (Hkv, B1, L, Dh) x2
            if self.all_decode:
                return ops.attend_decode(q, keys, values, self._decode_mask(window))  # (N, H*Dh)
            out[self.decode_rows] = ops.attend_decode(q[self.decode_rows], keys, values,
                                                      self._decode_mask(window))  # (B1, H*Dh)
        for i, s, e, table in self.prefill:
            start = self.entries[i].start
            keys, values = pool.gather_one(layer, table, start + e - s)  # (Hkv, L, Dh) x2
            out[s:e] = ops.attend_causal(q[s:e], keys, values, start, window)  # (T, H*Dh)
        return out
