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
        self._decode_block_lists = [tables[i] for i in decode]
        if decode:
            width = int(-(-self._decode_lengths.max() // pool.block_size))
            padded = np.zeros((len(decode), width), np.int64)  # (B1, nb) block 0 pads: finite, masked out
            for row, i in enumerate(decode):
                used = tables[i][:width]
                padded[row, : len(used)] = used
            self._decode_tables = ops.asarray(padded)  # (B1, nb)
        self._views: dict[int, tuple[Array, Array]] = {}  # window -> (tables, mask) of the decode rows
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

    def _decode_view(self, window: int) -> tuple[Array, Array]:
        """Block tables (B1, nb) and additive mask (B1, nb*BS) of the decode rows for one attention span.

        A sliding-window layer reads only the blocks that hold a row's last `window` positions, so its cost
        stays bounded however long the sequences grow; -inf hides keys past a row's length or its window.
        """
        view = self._views.get(window)
        if view is not None:
            return view
        bs, lengths = self.pool.block_size, self._decode_lengths  # (B1,)
        if window <= 0 or int(lengths.max()) <= window:
            tables, first = self._decode_tables, np.zeros_like(lengths)  # (B1, nb), (B1,)
        else:
            first = np.maximum(lengths - window, 0) // bs  # (B1,) first block inside the window
            count = (lengths - 1) // bs - first + 1  # (B1,)
            padded = np.zeros((len(lengths), int(count.max())), np.int64)  # (B1, nw) block 0 pads
            for row, table in enumerate(self._decode_block_lists):
                padded[row, : count[row]] = table[first[row] : first[row] + count[row]]
            tables = ops.asarray(padded)  # (B1, nw)
        key_pos = (first[:, None] * bs + np.arange(tables.shape[1] * bs)[None, :])  # (B1, L)
        hidden = key_pos >= lengths[:, None]  # (B1, L)
        if window > 0:
            hidden |= key_pos <= lengths[:, None] - 1 - window  # (B1, L)
        mask = ops.asarray(np.where(hidden, -np.inf, 0.0).astype(np.float32))  # (B1, L)
        self._views[window] = (tables, mask)
        return tables, mask

    def attention(self, layer: int, q: Array, k: Array, v: Array, *, window: int = 0) -> Array:
        """Store this step's k, v (N, Hkv, Dh) in the pool, then attend q (N, H, Dh) for every row: (N, H*Dh).

        window > 0: each query sees only the last `window` positions (itself included), as llama.cpp's SWA.
        """
        pool = self.pool
        pool.write(layer, self.write_blocks, self.write_offsets, k, v)
        n, n_heads, head_dim = q.shape
        out = ops.empty((n, n_heads * head_dim))  # (N, H*Dh)
        if self._decode_tables is not None:
            tables, mask = self._decode_view(window)  # (B1, nb), (B1, L)
            keys, values = pool.gather(layer, tables)  # (Hkv, B1, L, Dh) x2
            if self.all_decode:
                return ops.attend_decode(q, keys, values, mask)  # (N, H*Dh)
            out[self.decode_rows] = ops.attend_decode(q[self.decode_rows], keys, values, mask)  # (B1, H*Dh)
        for i, s, e, table in self.prefill:
            start = self.entries[i].start
            first_block = max(0, start - window + 1) // pool.block_size if window > 0 else 0
            keys, values = pool.gather_one(layer, table, start + e - s, first_block)  # (Hkv, L', Dh) x2
            out[s:e] = ops.attend_causal(q[s:e], keys, values, start, window,
                                         key_start=first_block * pool.block_size)  # (T, H*Dh)
        return out
