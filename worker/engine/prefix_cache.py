"""Prefix KV cache: reuse the keys/values of the longest cached prefix of a new prompt (bytes-bounded, LRU)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from worker.engine.kv_cache import SequenceKVCache


@dataclass
class PrefixCacheStats:
    """Counters a worker reports."""

    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0
    entries: int = 0
    bytes: int = 0
    evictions: int = 0


@dataclass
class _Entry:
    tokens: np.ndarray  # (T,) int64
    cache: SequenceKVCache  # holds exactly T positions, compact


class PrefixCache:
    """Maps token prefixes to their KV; lookups find the longest common prefix with any entry."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # key -> entry, least recently used first
        self._next_key = 0
        self.stats = PrefixCacheStats()

    def _longest_match(self, tokens: np.ndarray) -> tuple[int, int]:
        """(entry key, matched length) of the entry sharing the longest prefix with tokens; (-1, 0) if none."""
        best_key, best_len = -1, 0
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), len(tokens))
            if n <= best_len:
                continue
            diff = np.flatnonzero(entry.tokens[:n] != tokens[:n])  # (k,)
            common = int(diff[0]) if len(diff) else n
            if common > best_len:
                best_key, best_len = key, common
        return best_key, best_len

    def restore(self, tokens: list[int], cache: SequenceKVCache) -> int:
        """Fill `cache` with the longest cached prefix of tokens (at most len-1) and return its length."""
        query = np.asarray(tokens, dtype=np.int64)  # (T,)
        key, length = self._longest_match(query)
        length = min(length, len(tokens) - 1)
        if key < 0 or length <= 0:
            self.stats.misses += 1
            return 0
        entry = self._entries[key]
        self._entries.move_to_end(key)
        cache.copy_prefix_from(entry.cache, length)
        self.stats.hits += 1
        self.stats.tokens_saved += length
        return length

    def store(self, tokens: list[int], cache: SequenceKVCache) -> bool:
        """Keep a compact copy of the KV of `tokens` (the first len(tokens) positions of cache)."""
        length = len(tokens)
        if length == 0 or cache.length < length:
            return False
        query = np.asarray(tokens, dtype=np.int64)  # (T,)
        key, common = self._longest_match(query)
        if key >= 0 and common == length:  # an entry already covers this prefix
            self._entries.move_to_end(key)
            return False
        nbytes = length * cache.n_layers * cache.n_kv_heads * cache.head_dim * 2 * 4
        if nbytes > self.max_bytes:
            return False
        while self._entries and self.stats.bytes + nbytes > self.max_bytes:
            self._evict_oldest()
        copy = cache.compact_copy(length)
        self._entries[self._next_key] = _Entry(query, copy)
        self._next_key += 1
        # drop entries that are now strict prefixes of the new one: it serves every lookup they would
        for old_key in [k for k, e in self._entries.items()
                        if len(e.tokens) < length and np.array_equal(e.tokens, query[: len(e.tokens)])]:
            self._drop(old_key)
        self.stats.bytes += copy.nbytes
        self.stats.entries = len(self._entries)
        return True

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.stats.bytes -= entry.cache.nbytes
        self.stats.entries = len(self._entries)

    def _evict_oldest(self) -> None:
        oldest = next(iter(self._entries))
        self._drop(oldest)
        self.stats.evictions += 1

    def clear(self) -> None:
        """Drop every entry."""
        for key in list(self._entries):
            self._drop(key)
