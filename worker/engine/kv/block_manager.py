"""Which KV blocks belong to which sequence: block tables, reference counts, prefix caching, copy-on-write.

Full blocks are registered under a hash chain of their tokens (the block's tokens and the hash of the block
before it, as vLLM's automatic prefix caching does), so a later sequence with the same prefix shares them
instead of recomputing them. A block no sequence references but whose hash is registered stays cached in an
LRU of evictable blocks until a fresh block is needed. A chain starts from a seed (None for the base model,
the LoRA adapter set's key otherwise), so sequences under different adapters never share KV. Forked sequences share every block; the partly
filled last one is copied when one of them writes into it. Pure bookkeeping: no arrays here.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass


class NoFreeBlocks(Exception):
    """The pool cannot supply the blocks asked for (nothing was changed)."""


@dataclass(frozen=True)
class BlockCopy:
    """A copy the caller must perform on the arena before the next forward writes: src -> dst."""

    src: int
    dst: int


@dataclass
class PrefixCacheStats:
    """Counters of prefix-cache lookups."""

    queries: int = 0  # allocate() calls that looked the prefix up
    hits: int = 0  # of which at least one block was reused
    tokens_queried: int = 0
    tokens_hit: int = 0  # tokens served from cached blocks
    evictions: int = 0  # cached blocks given to new content


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The key of a full block: its tokens and the key of the block before it."""
    return hash((parent, tuple(tokens)))


class BlockManager:
    """Hands out fixed-size KV blocks to sequences; full blocks are shared by a hash chain of their tokens."""

    def __init__(self, n_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        if n_blocks < 1 or block_size < 1:
            raise ValueError("n_blocks and block_size must be positive")
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.stats = PrefixCacheStats()
        self._free: deque[int] = deque(range(n_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self._refs = [0] * n_blocks
        self._hash_of: dict[int, int] = {}  # block -> its chain hash (registered full blocks only)
        self._tokens_of: dict[int, tuple[int, ...]] = {}  # block -> its tokens (guards against hash collisions)
        self._block_of: dict[int, int] = {}  # chain hash -> block
        self._tables: dict[int, list[int]] = {}
        self._n_tokens: dict[int, int] = {}
        self._committed: dict[int, tuple[int, int | None]] = {}  # seq -> (registered leading blocks, last hash)
        self._pins = [0] * n_blocks  # references held outside any table (a tier write in flight, a tier read)
        self.high_water = 0  # 1 + the highest block ever handed out (never-used blocks go out lowest first)

    # ---- counts ---------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation can take: never used or released, plus cached ones nobody references."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one live sequence."""
        return self.n_blocks - self.num_free_blocks

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks that hold n_tokens tokens."""
        return -(-n_tokens // self.block_size)

    def has(self, seq_id: int) -> bool:
        """Whether the sequence holds a block table."""
        return seq_id in self._tables

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's blocks, in position order."""
        return self._tables[seq_id]

    def num_tokens(self, seq_id: int) -> int:
        """Positions the sequence's table has room assigned for."""
        return self._n_tokens[seq_id]

    # ---- allocation -----------------------------------------------------------------------------------

    def _cached_prefix(self, token_ids: Sequence[int], seed: int | None = None) -> tuple[list[int], int | None]:
        """Registered blocks that hold the leading full blocks of token_ids (chain from seed), and the last hash."""
        blocks, parent = self.cached_run(token_ids, seed)
        if blocks and len(blocks) * self.block_size >= len(token_ids):  # keep the last token to run, for fresh logits
            blocks.pop()
            parent = self._hash_of[blocks[-1]] if blocks else seed
        return blocks, parent

    def _fresh_needed(self, n_tokens: int, hits: list[int]) -> tuple[int, int]:
        """(fresh blocks a new table of n_tokens needs, blocks available to it) given its cache hits."""
        hit_evictable = sum(1 for b in hits if b in self._evictable)
        return self.blocks_for(n_tokens) - len(hits), self.num_free_blocks - hit_evictable

    def can_allocate(self, token_ids: Sequence[int], *, use_cache: bool = True, seed: int | None = None) -> bool:
        """Whether a new sequence holding token_ids fits now (counting the blocks its prefix would reuse)."""
        hits = self._cached_prefix(token_ids, seed)[0] if use_cache and self.enable_prefix_caching else []
        needed, available = self._fresh_needed(len(token_ids), hits)
        return needed <= available

    def allocate(self, seq_id: int, token_ids: Sequence[int], *, use_cache: bool = True,
                 seed: int | None = None) -> int:
        """Give a new sequence a table for token_ids; returns how many leading tokens are already computed.

        seed starts the block hash chain: the key of the sequence's LoRA adapter set (None: the base model).
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} already has blocks")
        lookup = use_cache and self.enable_prefix_caching
        hits, parent = self._cached_prefix(token_ids, seed) if lookup else ([], seed)
        needed, available = self._fresh_needed(len(token_ids), hits)
        if needed > available:
            raise NoFreeBlocks(f"{needed} blocks needed, {available} free")
        for block in hits:
            self._ref(block)
        table = hits + [self._take() for _ in range(needed)]
        self._tables[seq_id] = table
        self._n_tokens[seq_id] = len(token_ids)
        self._committed[seq_id] = (len(hits), parent)
        computed = len(hits) * self.block_size
        if lookup:
            self.stats.queries += 1
            self.stats.tokens_queried += len(token_ids)
            self.stats.hits += 1 if hits else 0
            self.stats.tokens_hit += computed
        return computed

    def committed_blocks(self, seq_id: int) -> int:
        """Leading full blocks of a sequence whose KV is computed and registered (or offered) for reuse."""
        return self._committed[seq_id][0]

    def cached_run(self, token_ids: Sequence[int], seed: int | None = None) -> tuple[list[int], int | None]:
        """Registered blocks holding the leading full blocks of token_ids as far as the chain goes, and the chain
        key of the last of them (seed when none)."""
        blocks: list[int] = []
        parent: int | None = seed
        size = self.block_size
        for i in range(len(token_ids) // size):
            chunk = tuple(token_ids[i * size : (i + 1) * size])
            key = chain_hash(parent, chunk)
            block = self._block_of.get(key)
            if block is None or self._tokens_of[block] != chunk:
                break
            blocks.append(block)
            parent = key
        return blocks, parent

    def pin(self, block: int) -> None:
        """Hold a block outside any table (not evicted, not reused) until unpin()."""
        self._ref(block)
        self._pins[block] += 1

    def unpin(self, block: int) -> None:
        """Drop a pin(): at zero references the block is cached (if registered) or free."""
        self._pins[block] -= 1
        self._release(block)

    def take_pinned(self) -> int:
        """A fresh block (free, else the least recently used cached one), pinned and not yet registered."""
        block = self._take()
        self._pins[block] += 1
        return block

    def register(self, block: int, parent: int | None, tokens: Sequence[int]) -> int | None:
        """Register a pinned block as the full block `tokens` after chain key `parent`; returns its chain key,
        or None when that key is registered already (the block then stays unregistered)."""
        chunk = tuple(tokens)
        key = chain_hash(parent, chunk)
        if len(chunk) != self.block_size or key in self._block_of or block in self._hash_of:
            return None
        self._block_of[key] = block
        self._hash_of[block] = key
        self._tokens_of[block] = chunk
        return key

    def append_cost(self, seq_id: int, n_new: int) -> int:
        """Fresh blocks append_slots(seq_id, n_new) would take (new blocks plus a copy-on-write copy)."""
        n = self._n_tokens[seq_id]
        table = self._tables[seq_id]
        cost = self.blocks_for(n + n_new) - len(table)
        if n_new > 0 and n % self.block_size and self._refs[table[-1]] > 1:
            cost += 1
        return cost

    def can_append(self, seq_id: int, n_new: int) -> bool:
        """Whether append_slots(seq_id, n_new) would succeed now."""
        return self.append_cost(seq_id, n_new) <= self.num_free_blocks

    def append_slots(self, seq_id: int, n_new: int) -> list[BlockCopy]:
        """Room for n_new more tokens at the sequence's end; a shared, partly filled last block is copied first."""
        if not self.can_append(seq_id, n_new):
            raise NoFreeBlocks(f"{self.append_cost(seq_id, n_new)} blocks needed, {self.num_free_blocks} free")
        table = self._tables[seq_id]
        n = self._n_tokens[seq_id]
        copies = []
        if n_new > 0 and n % self.block_size and self._refs[table[-1]] > 1:
            fresh = self._take()
            copies.append(BlockCopy(table[-1], fresh))
            self._release(table[-1])
            table[-1] = fresh
        table.extend(self._take() for _ in range(self.blocks_for(n + n_new) - len(table)))
        self._n_tokens[seq_id] = n + n_new
        return copies

    def truncate(self, seq_id: int, n_tokens: int) -> None:
        """Forget positions n_tokens.. of a sequence (rejected speculative tokens); trailing blocks are freed."""
        if n_tokens > self._n_tokens[seq_id]:
            raise ValueError("truncate cannot grow a sequence")
        table = self._tables[seq_id]
        keep = self.blocks_for(n_tokens)
        if keep < self._committed[seq_id][0]:
            raise ValueError("truncate cannot drop registered blocks")
        for block in reversed(table[keep:]):
            self._release(block)
        del table[keep:]
        self._n_tokens[seq_id] = n_tokens

    def commit(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """The KV of token_ids is now computed; register the sequence's newly full blocks for reuse."""
        if not self.enable_prefix_caching:
            return
        table = self._tables[seq_id]
        done, parent = self._committed[seq_id]
        full = min(len(token_ids), self._n_tokens[seq_id]) // self.block_size
        size = self.block_size
        for i in range(done, full):
            chunk = tuple(token_ids[i * size : (i + 1) * size])
            key = chain_hash(parent, chunk)
            block = table[i]
            if key not in self._block_of and block not in self._hash_of:
                self._block_of[key] = block
                self._hash_of[block] = key
                self._tokens_of[block] = chunk
            parent = key
        if full > done:
            self._committed[seq_id] = (full, parent)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (copy-on-write on the partly filled last one)."""
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id} already has blocks")
        table = list(self._tables[parent_id])
        for block in table:
            self._ref(block)
        self._tables[child_id] = table
        self._n_tokens[child_id] = self._n_tokens[parent_id]
        self._committed[child_id] = self._committed[parent_id]

    def free(self, seq_id: int) -> None:
        """Drop a sequence (finished, cancelled or preempted); cached blocks stay findable until evicted."""
        table = self._tables.pop(seq_id)
        del self._n_tokens[seq_id], self._committed[seq_id]
        for block in reversed(table):  # the tail first: a prefix's first blocks are evicted last
            self._release(block)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block nobody references."""
        while self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._unregister(block)
            self._free.append(block)

    # ---- blocks ---------------------------------------------------------------------------------------

    def _take(self) -> int:
        """A block for new content: a free one, else the least recently used cached one."""
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            self._unregister(block)
            self.stats.evictions += 1
        self._refs[block] = 1
        self.high_water = max(self.high_water, block + 1)
        return block

    def _ref(self, block: int) -> None:
        """One more user of a block (taking it out of the evictable LRU)."""
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    def _release(self, block: int) -> None:
        """One user fewer; at zero the block is cached (if registered) or free."""
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def _unregister(self, block: int) -> None:
        """Forget a block's hash."""
        key = self._hash_of.pop(block, None)
        if key is not None:
            del self._block_of[key]
            del self._tokens_of[block]

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (for tests)."""
        counts = [0] * self.n_blocks
        for table in self._tables.values():
            for block in table:
                counts[block] += 1
        assert [c + p for c, p in zip(counts, self._pins)] == self._refs, "reference counts differ from the tables"
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free) and not free & evictable, "a block is listed twice"
        used = {b for b in range(self.n_blocks) if self._refs[b]}
        assert not used & (free | evictable), "a referenced block is free"
        assert len(used) + len(free) + len(evictable) == self.n_blocks, "a block is lost"
        assert all(b in self._hash_of for b in evictable), "an evictable block has no hash"
        assert all(self._block_of[k] == b for b, k in self._hash_of.items()), "hash maps disagree"
        assert all(b not in free for b in self._hash_of), "a free block is still registered"
        for seq_id, table in self._tables.items():
            assert len(table) == self.blocks_for(self._n_tokens[seq_id]), f"sequence {seq_id} table size"
