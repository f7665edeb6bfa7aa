"""The engine-owned KV memory of one worker: per-layer arenas of fixed-size blocks, allocated once.

Which block belongs to which sequence (and which full blocks are shared by a prefix) is the BlockManager's
business; this module only stores keys/values at (block, offset) and reads them back through block tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from worker.engine import ops
from worker.engine.block_manager import BlockCopy, BlockManager
from worker.engine.config import ModelConfig
from worker.engine.ops import Array

DEFAULT_BLOCK_SIZE = 32  # tokens per block: prefix sharing granularity vs. gather chunk size (see bench/batching.py)


class KVPool:
    """Keys and values of every layer for all sequences of one engine, in blocks of `block_size` tokens."""

    def __init__(self, config: ModelConfig, n_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 *, enable_prefix_caching: bool = True) -> None:
        if n_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 blocks, got {n_blocks}")
        self.config = config
        self.block_size = block_size
        self.n_blocks = n_blocks
        shape = (config.n_kv_heads, n_blocks, block_size, config.head_dim)
        # zeros, not empty: padded reads of never-written slots must be finite. fill() touches every page now,
        # so the pool's memory is committed once at start-up instead of page-faulting inside decode steps.
        self.keys = [ops.xp.zeros(shape, np.float32) for _ in range(config.n_layers)]  # L x (Hkv, NB, BS, Dh)
        self.values = [ops.xp.zeros(shape, np.float32) for _ in range(config.n_layers)]  # L x (Hkv, NB, BS, Dh)
        for array in (*self.keys, *self.values):
            array.fill(0.0)
        self.blocks = BlockManager(n_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
        self._scratch: tuple[Array, Array] | None = None  # gather's reusable output buffers

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
        """Bytes one block takes across all layers (keys and values)."""
        return block_size * config.kv_bytes_per_token

    @classmethod
    def from_budget(cls, config: ModelConfig, budget_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE,
                    *, enable_prefix_caching: bool = True) -> KVPool:
        """As many blocks as fit in `budget_bytes`."""
        n_blocks = max(2, budget_bytes // cls.bytes_per_block(config, block_size))
        return cls(config, int(n_blocks), block_size, enable_prefix_caching=enable_prefix_caching)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole arena."""
        return self.n_blocks * self.bytes_per_block(self.config, self.block_size)

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

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Perform the BlockManager's copy-on-write copies in every layer."""
        for copy in copies:
            for keys, values in zip(self.keys, self.values):
                keys[:, copy.dst] = keys[:, copy.src]  # (Hkv, BS, Dh)
                values[:, copy.dst] = values[:, copy.src]  # (Hkv, BS, Dh)

    # ---- the forward side -----------------------------------------------------------------------------

    def write(self, layer: int, blocks: Array, offsets: Array, k: Array, v: Array) -> None:
        """Store new keys/values k, v (N, Hkv, Dh) at (blocks, offsets) (N,) of one layer."""
        self.keys[layer][:, blocks, offsets] = k.transpose(1, 0, 2)  # (Hkv, N, Dh)
        self.values[layer][:, blocks, offsets] = v.transpose(1, 0, 2)  # (Hkv, N, Dh)

    def gather(self, layer: int, tables: Array) -> tuple[Array, Array]:
        """Keys and values of many sequences through padded block tables (B, nb): each (Hkv, B, nb*BS, Dh).

        The result lives in scratch buffers reused from call to call (valid until the next gather): fresh
        multi-MB arrays every layer would page-fault and zero new memory each time.
        """
        b, nb = tables.shape
        n_kv, dh = self.config.n_kv_heads, self.config.head_dim
        shape = (n_kv, b, nb, self.block_size, dh)
        size = n_kv * b * nb * self.block_size * dh
        if self._scratch is None or self._scratch[0].size < size:  # grown, never shrunk
            self._scratch = (ops.empty((2 * size,)), ops.empty((2 * size,)))  # (S,) x2 flat
        keys = self._scratch[0][:size].reshape(shape)  # (Hkv, B, nb, BS, Dh)
        values = self._scratch[1][:size].reshape(shape)  # (Hkv, B, nb, BS, Dh)
        ops.xp.take(self.keys[layer], tables, axis=1, out=keys)  # (Hkv, B, nb, BS, Dh)
        ops.xp.take(self.values[layer], tables, axis=1, out=values)  # (Hkv, B, nb, BS, Dh)
        length = nb * self.block_size
        return keys.reshape(n_kv, b, length, dh), values.reshape(n_kv, b, length, dh)  # (Hkv, B, L, Dh) x2

    def gather_one(self, layer: int, table: Array, length: int, first_block: int = 0) -> tuple[Array, Array]:
        """Keys and values of positions [first_block*BS, length) of one sequence: each (Hkv, L', Dh)."""
        used = table[first_block : -(-length // self.block_size)]  # (nb',)
        n_kv, dh = self.config.n_kv_heads, self.config.head_dim
        span = length - first_block * self.block_size
        keys = self.keys[layer][:, used].reshape(n_kv, -1, dh)[:, :span]  # (Hkv, L', Dh)
        values = self.values[layer][:, used].reshape(n_kv, -1, dh)[:, :span]  # (Hkv, L', Dh)
        return keys, values
