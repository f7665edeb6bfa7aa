"""Per-sequence key/value cache: one growable float32 buffer per sequence, never inside a layer."""

from __future__ import annotations

import numpy as np

from worker.engine.config import ModelConfig

GROWTH_TOKENS = 256  # capacity grows in steps of this many tokens


class SequenceKVCache:
    """Keys and values of every layer for one sequence, positions [0, length)."""

    def __init__(self, config: ModelConfig, capacity: int = 0) -> None:
        self.n_layers = config.n_layers
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.max_length = config.context_length
        self.length = 0
        self.keys = np.empty((self.n_layers, self.n_kv_heads, 0, self.head_dim), np.float32)  # (L, Hkv, C, Dh)
        self.values = np.empty_like(self.keys)  # (L, Hkv, C, Dh)
        if capacity:
            self.reserve(capacity)

    @property
    def capacity(self) -> int:
        """Tokens the buffers can hold without growing."""
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers (capacity, not length)."""
        return int(self.keys.nbytes + self.values.nbytes)

    @staticmethod
    def bytes_for(config: ModelConfig, tokens: int) -> int:
        """Bytes the buffers of a cache holding `tokens` tokens will take (rounded up to the growth step)."""
        capacity = -(-tokens // GROWTH_TOKENS) * GROWTH_TOKENS
        return capacity * config.kv_bytes_per_token

    def reserve(self, total_tokens: int) -> None:
        """Grow the buffers so that `total_tokens` positions fit."""
        if total_tokens <= self.capacity:
            return
        new_capacity = -(-total_tokens // GROWTH_TOKENS) * GROWTH_TOKENS
        shape = (self.n_layers, self.n_kv_heads, new_capacity, self.head_dim)
        keys = np.empty(shape, np.float32)  # (L, Hkv, C', Dh)
        values = np.empty(shape, np.float32)  # (L, Hkv, C', Dh)
        keys[:, :, : self.length] = self.keys[:, :, : self.length]  # (L, Hkv, T, Dh)
        values[:, :, : self.length] = self.values[:, :, : self.length]  # (L, Hkv, T, Dh)
        self.keys, self.values = keys, values

    def copy_prefix_from(self, other: SequenceKVCache, length: int) -> None:
        """Make this cache hold the first `length` positions of `other`."""
        self.reserve(length)
        self.keys[:, :, :length] = other.keys[:, :, :length]  # (L, Hkv, T, Dh)
        self.values[:, :, :length] = other.values[:, :, :length]  # (L, Hkv, T, Dh)
        self.length = length

    def compact_copy(self, length: int) -> SequenceKVCache:
        """A new cache holding a copy of the first `length` positions, with no spare capacity."""
        copy = SequenceKVCache.__new__(SequenceKVCache)
        copy.n_layers, copy.n_kv_heads, copy.head_dim = self.n_layers, self.n_kv_heads, self.head_dim
        copy.max_length = self.max_length
        copy.keys = np.ascontiguousarray(self.keys[:, :, :length])  # (L, Hkv, T, Dh)
        copy.values = np.ascontiguousarray(self.values[:, :, :length])  # (L, Hkv, T, Dh)
        copy.length = length
        return copy

    def release(self) -> None:
        """Drop the buffers (the cache can be reused and will grow again)."""
        self.keys = np.empty((self.n_layers, self.n_kv_heads, 0, self.head_dim), np.float32)  # (L, Hkv, 0, Dh)
        self.values = np.empty_like(self.keys)  # (L, Hkv, 0, Dh)
        self.length = 0
