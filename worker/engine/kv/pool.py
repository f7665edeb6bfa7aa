"""The engine-owned KV memory of one worker: per-layer arenas of fixed-size blocks, allocated once.

Which block belongs to which sequence (and which full blocks are shared by a prefix) is the BlockManager's
business; this module only stores keys/values at (block, offset) and reads them back through block tables.
Keys and values are kept as float16 by default, as llama.cpp's cache is: decode attention at long contexts is bound
by reading them (32 streams at ~120 positions: 10-12 ms a step against 16 in float32), and the budget holds twice
the tokens. The attention kernels widen each row to float32 as they load it (simd.vload_wide).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from worker.engine.formats.config import KV_ELEMENT_BYTES, ModelConfig
from worker.engine.kernels import layer_kernels
from worker.engine.kv.arena_layout import block_view, group_bytes, new_arena
from worker.engine.kv.block_manager import BlockCopy, BlockManager
from worker.engine.kv.pages import populate, runs
from worker.engine.kv.recurrent_state import RecurrentStates
from worker.engine.ops import Array

KV_DTYPE = np.float16  # the default (LLMFLEET_KV_DTYPE; the README says when float32 is the better choice)
assert np.dtype(KV_DTYPE).itemsize == KV_ELEMENT_BYTES
KV_DTYPES = ("float16", "float32")  # what a pool can hold; shared/settings.py lists them for LLMFLEET_KV_DTYPE (a test ties the two)
DEFAULT_BLOCK_SIZE = 32  # tokens per block: prefix sharing granularity vs. gather chunk size (see bench/batching.py)
DEFAULT_STATE_SLOTS = 64  # sequences a hybrid model's pool holds state for, unless told (zero pages until used)


class KVPool:
    """Keys and values of every layer for all sequences of one engine, in blocks of `block_size` tokens."""

    def __init__(self, config: ModelConfig, n_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 *, enable_prefix_caching: bool = True, dtype: Any = KV_DTYPE,
                 state_slots: int = DEFAULT_STATE_SLOTS) -> None:
        if n_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 blocks, got {n_blocks}")
        if np.dtype(dtype).name not in KV_DTYPES:
            raise ValueError(f"a KV pool holds one of {', '.join(KV_DTYPES)}, not {np.dtype(dtype).name}")
        self.config = config
        self.dtype = np.dtype(dtype)
        self.block_size = block_size
        self.n_blocks = n_blocks
        shape = (n_blocks, config.n_kv_heads, block_size, config.head_dim, self.dtype)
        # zeros, not empty: padded reads of never-written slots must be finite. Pages are committed as blocks are
        # first written, 2 MiB (a group of blocks) at a time (kv/arena_layout.py): filling the pool at start took
        # 0.2-1.5 s per GiB here, and every worker's resident memory was its whole budget from the start
        attending = config.attention_layers  # a hybrid's recurrent layers keep no keys or values
        self.arena_of = {layer: i for i, layer in enumerate(attending)}  # model layer -> its arena
        self.keys = [new_arena(*shape) for _ in attending]  # La x (NG, Hkv, G, BS, Dh)
        self.values = [new_arena(*shape) for _ in attending]  # La x (NG, Hkv, G, BS, Dh)
        # a hybrid's recurrent state per sequence (its prefix checkpoints included)
        self.states = RecurrentStates(config, state_slots) if config.recurrent_layers else None
        self.blocks = BlockManager(n_blocks, block_size, enable_prefix_caching=enable_prefix_caching)

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int = DEFAULT_BLOCK_SIZE, dtype: Any = KV_DTYPE) -> int:
        """Bytes one block takes across all layers (keys and values)."""
        return block_size * config.kv_values_per_token * np.dtype(dtype).itemsize

    @classmethod
    def from_budget(cls, config: ModelConfig, budget_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE,
                    *, enable_prefix_caching: bool = True, dtype: Any = KV_DTYPE,
                    state_slots: int = DEFAULT_STATE_SLOTS) -> KVPool:
        """As many blocks as fit in `budget_bytes` (a hybrid's state slots are apart: Scheduler sizes both)."""
        n_blocks = max(2, budget_bytes // cls.bytes_per_block(config, block_size, dtype))
        return cls(config, int(n_blocks), block_size, enable_prefix_caching=enable_prefix_caching, dtype=dtype,
                   state_slots=state_slots)

    @property
    def block_bytes(self) -> int:
        """Bytes one block of this pool takes across all layers."""
        return self.bytes_per_block(self.config, self.block_size, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole arena and the recurrent state slots."""
        return self.n_blocks * self.block_bytes + (self.states.nbytes if self.states is not None else 0)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the arena holds when every block is full."""
        return self.n_blocks * self.block_size

    # ---- the sequence side (thin wrappers that also perform the copies the BlockManager asks for) ------

    def ensure(self, seq_id: int, n_tokens: int) -> None:
        """Make a sequence's table cover n_tokens positions (a new sequence gets a table, without cache lookup)."""
        if not self.blocks.has(seq_id):
            self.blocks.allocate(seq_id, [0] * n_tokens, use_cache=False)
        elif n_tokens > self.blocks.num_tokens(seq_id):
            self.extend(seq_id, n_tokens - self.blocks.num_tokens(seq_id))

    def extend(self, seq_id: int, n_new: int) -> None:
        """Make room for n_new more tokens of a sequence, copying a shared last block first (copy-on-write)."""
        self.copy_blocks(self.blocks.append_slots(seq_id, n_new))

    def fork(self, parent_id: int, child_id: int) -> None:
        """A child sequence shares the parent's blocks (copy-on-write) and starts from a copy of its recurrent
        state."""
        self.blocks.fork(parent_id, child_id)
        if self.states is not None:
            self.states.fork(parent_id, child_id, self.blocks.has)

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Perform the BlockManager's copy-on-write copies in every layer."""
        for copy in copies:
            for keys, values in zip(self.keys, self.values):
                block_view(keys, copy.dst)[...] = block_view(keys, copy.src)  # (Hkv, BS, Dh)
                block_view(values, copy.dst)[...] = block_view(values, copy.src)  # (Hkv, BS, Dh)

    @property
    def group_blocks(self) -> int:
        """Blocks in one group of an arena (its 2 MiB page: kv/arena_layout.py)."""
        return self.keys[0].shape[2] if self.keys else self.n_blocks

    def populate_groups(self, first: int, stop: int) -> None:
        """Commit the pages of groups [first, stop) in every arena (contents unchanged; any thread)."""
        for arena in [*self.keys, *self.values]:  # La x (NG, Hkv, G, BS, Dh)
            size = group_bytes(arena)
            populate(arena, first * size, min(stop, arena.shape[0]) * size)

    def populate(self, blocks: Sequence[int]) -> None:
        """Commit the pages of these blocks in every arena before they are written whole (a host-tier fill): one
        system call per arena and run of consecutive groups holding them (a group is the 2 MiB page the first write
        commits whole: kv/arena_layout.py) instead of a fault per page (worker/engine/kv/pages.py)."""
        for first, stop in runs(block // self.group_blocks for block in blocks):
            self.populate_groups(first, stop)

    # ---- the forward side -----------------------------------------------------------------------------

    def write(self, layer: int, blocks: Array, offsets: Array, k: Array, v: Array) -> None:
        """Store new keys/values k, v (N, Hkv, Dh) at (blocks, offsets) (N,) of one attention layer."""
        arena = self.arena_of[layer]
        layer_kernels.store_rows(self.keys[arena], blocks, offsets, k)  # (NG, Hkv, G, BS, Dh) <- (N, Hkv, Dh)
        layer_kernels.store_rows(self.values[arena], blocks, offsets, v)

    def layer_arenas(self, layer: int) -> tuple[Array, Array]:
        """One attention layer's keys and values (NG, Hkv, G, BS, Dh) x2 (kv/arena_layout.py), read in place."""
        arena = self.arena_of[layer]
        return self.keys[arena], self.values[arena]
