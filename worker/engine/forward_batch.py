"""One forward step's batch description: tokens, positions, sequence spans and block tables, plus attention.

Built once per step; architecture blocks call `attention()` per layer. Every row of the step, a decode token or one
of a prompt chunk, is one query of the same compiled kernel (paged_attention.paged_attend_decode) over its own positions
as the float16 pool holds them (this step's keys written first): a row's attention is the same computation whether
it is decoded alone, prefilled in one chunk or in many, or re-prefilled after a failover (batch invariance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from worker.engine import ops
from worker.engine.kv.pool import KVPool
from worker.engine.ops import Array, RotaryTable

if TYPE_CHECKING:
    from worker.engine.lora import LoraUse

OutputKind = Literal["last", "all", "hidden", "none"]


@dataclass
class BatchEntry:
    """One sequence's part of a step: new tokens at positions start.., in the pool under seq_id."""

    seq_id: int
    tokens: Array  # (T,) int token ids
    start: int  # position of tokens[0]: the sequence's tokens already in the pool
    output: OutputKind = "last"
    loras: tuple[LoraUse, ...] = ()  # adapters (and scales) applied to this sequence's rows


@dataclass(frozen=True)
class SuspendedForward:
    """A forward stopped before `layer`: its entries and their rows' hidden states entering that layer (the layers
    before it wrote their keys and values to the pool). Rows are independent, so any subset of the entries goes on
    to the same bits (`keep`)."""

    entries: list[BatchEntry]
    layer: int
    hidden: Array  # (N, D) a copy: the forward's own buffers are reused by the steps in between

    def keep(self, seq_ids: set[int]) -> SuspendedForward:
        """The same forward for the entries of `seq_ids` only (in the same order; the others' rows dropped)."""
        kept, rows, start = [], [], 0
        for entry in self.entries:
            end = start + len(entry.tokens)
            if entry.seq_id in seq_ids:
                kept.append(entry)
                rows.append(np.arange(start, end))
            start = end
        index = ops.asarray(np.concatenate(rows).astype(np.int64)) if rows else None  # (M,)
        hidden = self.hidden[index] if index is not None else self.hidden[:0]  # (M, D)
        return SuspendedForward(kept, self.layer, hidden)


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
        self._lengths = ops.asarray(positions + 1)  # (N,) each row attends to positions [first, position]
        width = int(-(-int(positions.max() + 1) // pool.block_size))
        row_tables = np.zeros((len(positions), width), np.int64)  # (N, nb) block 0 pads: never read
        for i, table in enumerate(tables):
            used = table[:width]
            row_tables[self.starts[i] : self.starts[i + 1], : len(used)] = used
        self._tables = ops.asarray(row_tables)  # (N, nb)
        self._first_positions: dict[int, Array] = {}  # window -> (N,) first visible position of each row
        self._angles: dict[int, tuple[Array, Array]] = {}
        # a hybrid's recurrent layers: each entry's state slot, checked to stand at the entry's start
        self.state_slots = pool.states.prepare(entries, pool.blocks.has) if pool.states is not None else None  # (B,)
        self.lora = None
        if any(e.loras for e in entries):
            from worker.engine.lora import LoraBatch

            self.lora = LoraBatch.from_rows([e.loras for e in entries], self.starts)

    def adapt(self, layer: int, projection: str, x: Array, out: Array) -> Array:
        """Add the step's LoRA updates of one projection (input x (N, in), output out (N, out)); returns out."""
        return out if self.lora is None else self.lora.add(layer, projection, x, out)

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

    def first_positions(self, window: int) -> Array:
        """The first position each row attends to (N,): 0, or its last `window` positions on a sliding layer.

        The kernel reads only positions [first, position] through the block table, so a sliding-window layer's cost
        stays bounded however long the sequences grow.
        """
        first = self._first_positions.get(window)
        if first is None:
            first = (ops.xp.maximum(self._lengths - window, 0) if window > 0
                     else ops.xp.zeros_like(self._lengths))  # (N,)
            self._first_positions[window] = first
        return first

    def attention(self, layer: int, q: Array, k: Array, v: Array, *, window: int = 0,
                  sinks: Array | None = None) -> Array:
        """Store this step's k, v (N, Hkv, Dh) in the pool, then attend q (N, H, Dh) for every row: (N, H*Dh).

        window > 0: each query sees only the last `window` positions (itself included), as llama.cpp's SWA.
        sinks (H,): gpt-oss's per-head logit in each softmax's denominator.
        """
        pool = self.pool
        pool.write(layer, self.write_blocks, self.write_offsets, k, v)
        keys, values = pool.layer_arenas(layer)  # (NG, Hkv, G, BS, Dh) x2, read in place
        return ops.paged_attend_decode(q, keys, values, self._tables, self._lengths,
                                       self.first_positions(window), sinks)  # (N, H*Dh)
