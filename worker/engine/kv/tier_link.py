"""One worker's KV pool joined to its host's tier (worker/engine/kv/tier.py): full blocks go out from a writer thread,
the tier's blocks come in at admission, before prefill.

A block's tier key follows the pool's hash chain (a block's tokens and the key of the block before it) with a stable
digest, blake2b-128 from a namespace of the model file's key and the KV layout (Python's hash() differs between
processes). Only base-model chains go to the tier (a LoRA adapter set's KV stays in the worker's pool).

Out: when a sequence's blocks fill (Admission.commit), each is pinned in the pool and queued; the writer thread copies
it into a staging buffer, checksums it and writes it; the step's thread unpins written blocks at its next admission
(`settle`). The step never waits for the tier: past `max_pending` queued blocks, new ones are not offered. In
(`fill`): the tier blocks that extend the pool's own cached run of a prompt are copied into fresh pool blocks and
registered in the pool's prefix cache, so the allocation that follows finds them as hits and prefills only the rest.
Bytes are copied as they are: batch-invariant numerics make a block any worker computed the block this one would.

Partial blocks: a sequence's last, partly filled block is written too, as its tokens are computed (`offer_partial`:
its first n rows, copied on the step's thread), keyed by the chain key before it and those n tokens: every token while
the step runs fewer than SNAPSHOT_STREAMS sequences, every 1 + running // SNAPSHOT_STREAMS tokens beyond (each
snapshot costs the writer about 0.2 ms). A snapshot is written into the slot of the one it replaces, and the last
one is discarded once its block is full. A worker taking over a stream (or a prompt that continues one) reads the
largest snapshot its own tokens match into its fresh block (`fill_partial`) after allocation and prefills only the
rows after it and the last token, which always runs. Rows of a causal model's KV depend only on the tokens up to them,
so the rows of any sequence with the same leading tokens are the same bits.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import queue
import socket
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worker.engine.formats.repack_cache import model_key
from worker.engine.kernels.kv_rows import byte_views, gather_rows, scatter_rows
from worker.engine.kv.arena_layout import block_view
from worker.engine.kv.pool import KVPool
from worker.engine.kv.tier import TierFile, TierStats, key_words

KV_NUMERICS = 1  # bump whenever a change to the forward changes the bits of keys or values (old tiers are replaced)
CHAINS_KEPT = 1024  # sequences whose last chain key is remembered (a forgotten one is recomputed from its tokens)
SNAPSHOT_STREAMS = 16  # partial snapshots are taken every 1 + running sequences // this many tokens (at 64 streams
# every 5: a snapshot each token cost 3-7% of the 1B's rate there, against 1 row a stream to prefill after a takeover)
FILL_THREADS = max(1, min(4, os.cpu_count() or 1))  # threads a fill reads blocks on (bounded by memory, not cores)
PARTIAL_MARK = b"partial"  # appended to a partial block's key material: it never equals a full block's key
DEFAULT_DIR = "/dev/shm/llmfleet-kv"
EXPORTED = ("lookups", "hits", "misses", "tokens_hit", "blocks_written", "evictions", "skipped", "bytes_used",
            "bytes_total")
log = logging.getLogger(__name__)


NO_BLOCK = -1  # a writer item that pins no pool block (a partial snapshot carries its own bytes)


@dataclass(frozen=True)
class WriterItem:
    """One job of the writer thread: a pinned pool block, a partial snapshot's bytes, or a key to discard."""

    key: bytes
    block: int = NO_BLOCK
    data: np.ndarray | None = None  # (bytes,) uint8
    replaces: bytes | None = None  # the key of the snapshot this one replaces, in its slot
    discard: bool = False


class PoolTier:
    """A KV pool's link to a TierFile: offer() and a writer thread out, fill() in."""

    def __init__(self, pool: KVPool, tier: TierFile, namespace: bytes, max_pending: int | None = None) -> None:
        self.pool = pool
        self.tier = tier
        self.namespace = namespace
        self.max_pending = max(1, pool.n_blocks // 4) if max_pending is None else max_pending
        self._queue: queue.SimpleQueue[WriterItem | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[int] = queue.SimpleQueue()  # blocks written (NO_BLOCK: a partial snapshot)
        self._pending = 0  # blocks pinned for the writer and partial snapshots queued, not yet settled
        self._chains: OrderedDict[int, tuple[int, bytes]] = OrderedDict()  # seq -> (blocks keyed, last key)
        self._partials: dict[int, tuple[int, int, bytes, bool]] = {}  # seq -> its last snapshot's (block index,
        # rows, key, kept)
        self._key_words, self._value_words = byte_views(pool.keys), byte_views(pool.values)  # kernels/kv_rows.py
        nothing = np.empty(0, np.uint8)  # (0,): the copies compile (or load) for this layer count now, not in a step
        self._gather(0, 0, nothing)
        self._scatter(nothing, 0, 0)
        self._readers: ThreadPoolExecutor | None = None  # fill's threads, started by the first fill
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._write_loop, name="kv-tier-writer", daemon=True)
        self._thread.start()

    @property
    def identity(self) -> str:
        """Which host tier this is, as placement compares it: "host:directory"."""
        return f"{socket.gethostname()}:{self.tier.path.parent}"

    @property
    def stats(self) -> TierStats:
        """This process's tier counters and the file's gauges."""
        return self.tier.stats

    def exported(self) -> dict[str, float]:
        """The counters and gauges a worker publishes for /metrics (`kv_tier_*`)."""
        stats = self.tier.stats
        stats.bytes_used = self.tier.bytes_used()
        return {f"kv_tier_{name}": float(getattr(stats, name)) for name in EXPORTED}

    # ---- keys ----------------------------------------------------------------------------------------------

    def _keys(self, token_ids: Sequence[int], first: int, last: int, parent: bytes | None = None) -> list[bytes]:
        """Chain keys of blocks first..last-1 of token_ids (parent: the key of block first-1, computed if None)."""
        size = self.pool.block_size
        if parent is None:
            parent, start = self.namespace, 0
        else:
            start = first
        keys: list[bytes] = []
        tokens = np.asarray(token_ids[: last * size], np.int64)  # (last * BS,)
        for i in range(start, last):
            parent = hashlib.blake2b(parent + tokens[i * size : (i + 1) * size].tobytes(), digest_size=16).digest()
            if i >= first:
                keys.append(parent)
        return keys

    def _parent(self, seq_id: int | None, token_ids: Sequence[int], index: int) -> bytes:
        """The chain key before block `index` of token_ids (the namespace before the first)."""
        known = self._chains.get(seq_id) if seq_id is not None else None
        if known is not None and known[0] == index:
            return known[1]
        parent = self._keys(token_ids, index - 1, index)[0] if index > 0 else self.namespace
        if seq_id is not None:
            self._chains[seq_id] = (index, parent)
        return parent

    @staticmethod
    def _partial_key(parent: bytes, tokens: Sequence[int]) -> bytes:
        """A partial block's key: the chain key before it, its leading tokens and a mark no full block's key has."""
        material = parent + np.asarray(tokens, np.int64).tobytes() + PARTIAL_MARK  # (n,) int64 as bytes
        return hashlib.blake2b(material, digest_size=16).digest()

    # ---- out -----------------------------------------------------------------------------------------------

    def offer(self, seq_id: int, table: Sequence[int], token_ids: Sequence[int], first: int, last: int) -> None:
        """Blocks first..last-1 of a sequence (table: its block table) are full and computed: queue them."""
        self.settle()
        known = self._chains.pop(seq_id, None)
        parent = known[1] if known is not None and known[0] == first and first > 0 else None
        keys = self._keys(token_ids, first, last, parent)
        self._chains[seq_id] = (last, keys[-1])
        while len(self._chains) > CHAINS_KEPT:
            self._chains.popitem(last=False)
        for i, key in zip(range(first, last), keys, strict=True):
            if self._pending >= self.max_pending:
                self.tier.stats.skipped += 1
                continue
            self.pool.blocks.pin(table[i])
            self._put(WriterItem(key, block=table[i]))
        partial = self._partials.get(seq_id)
        if partial is not None and partial[0] < last:  # its block is full now: the snapshot is not needed
            del self._partials[seq_id]
            if not partial[3]:
                self._put(WriterItem(partial[2], discard=True))

    def offer_partial(self, seq_id: int, table: Sequence[int], token_ids: Sequence[int], computed: int, *,
                      keep: bool = False, running: int = 1) -> None:
        """A sequence's first `computed` tokens are in the pool: write its last block's rows as a partial snapshot
        (copied now, written by the writer thread) when 1 + running // SNAPSHOT_STREAMS rows came since the last.
        Each replaces the sequence's last snapshot, unless that one was to be kept (a prompt's: the same prompt
        again reads it)."""
        self.settle()
        size = self.pool.block_size
        index, rows = computed // size, computed % size
        last = self._partials.get(seq_id)
        if rows == 0 or (last is not None and last[0] == index and rows - last[1] < 1 + running // SNAPSHOT_STREAMS):
            return
        if self._pending >= self.max_pending:
            self.tier.stats.skipped += 1
            return
        key = self._partial_key(self._parent(seq_id, token_ids, index), token_ids[index * size : index * size + rows])
        data = np.empty(self._row_bytes(rows), np.uint8)  # (2 L Hkv n Dh x itemsize,)
        self._gather(table[index], rows, data)
        self._partials[seq_id] = (index, rows, key, keep)
        replaces = last[2] if last is not None and not last[3] else None  # written into its slot
        self._put(WriterItem(key, data=data, replaces=replaces))

    def forget(self, seq_id: int) -> None:
        """A sequence ended: its last snapshot stays in the tier (a prompt that continues it reads it), untracked."""
        self._partials.pop(seq_id, None)

    def _put(self, item: WriterItem) -> None:
        if not item.discard:
            self._pending += 1
        self._idle.clear()
        self._queue.put(item)

    def settle(self) -> None:
        """Unpin the blocks the writer is done with (the step's thread only: the BlockManager is not shared)."""
        while True:
            try:
                block = self._done.get_nowait()
            except queue.Empty:
                return
            if block != NO_BLOCK:
                self.pool.blocks.unpin(block)
            self._pending -= 1

    def _write_loop(self) -> None:
        staging = np.empty(self.tier.block_bytes, np.uint8)  # (block_bytes,)
        while (item := self._queue.get()) is not None:
            try:
                if item.discard:
                    self.tier.discard(item.key)
                elif item.data is not None:  # a partial snapshot: put() finds a duplicate itself
                    self.tier.put(item.key, item.data, item.replaces)
                elif self.tier.has(item.key):
                    self.tier.stats.duplicates += 1
                else:
                    self._gather(item.block, self.pool.block_size, staging)
                    self.tier.put(item.key, staging)
            except Exception:  # the writer must outlive any one block
                self.tier.warn("writer", "KV tier writer: a block write failed; it is skipped", exc_info=True)
            finally:
                if not item.discard:
                    self._done.put(item.block)
                if self._queue.empty():
                    self._idle.set()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued block is written, then settle (tests, a draining worker)."""
        done = self._idle.wait(timeout_s)
        self.settle()
        return done

    def close(self) -> None:
        """Stop the writer once the queue is written, and close the file."""
        self._queue.put(None)
        self._thread.join(timeout=30)
        if self._readers is not None:
            self._readers.shutdown()
        self.settle()
        self.tier.close()

    # ---- block bytes ---------------------------------------------------------------------------------------

    def _row_bytes(self, rows: int) -> int:
        """Bytes of `rows` rows of one block, keys and values of every layer."""
        return self.tier.block_bytes // self.pool.block_size * rows

    def _gather(self, block: int, rows: int, out: np.ndarray) -> None:
        """The first `rows` rows of one pool block, every layer's keys then values, into out (bytes,) uint8."""
        gather_rows(self._key_words, self._value_words, block, rows, out)

    def _scatter(self, data: np.ndarray, block: int, rows: int) -> None:
        """The reverse of _gather: data's bytes into the first `rows` rows of one pool block."""
        scatter_rows(data, self._key_words, self._value_words, block, rows)

    # ---- in ------------------------------------------------------------------------------------------------

    def fill(self, token_ids: Sequence[int]) -> int:
        """Copy the tier's blocks that extend the pool's cached run of token_ids into the pool's prefix cache (all
        but the block holding the last token, which is always run); returns the tokens added."""
        self.settle()
        blocks, size = self.pool.blocks, self.pool.block_size
        usable = (len(token_ids) - 1) // size
        hits, parent = blocks.cached_run(token_ids)
        if len(hits) >= usable:
            return 0
        for block in hits:  # not evicted by the blocks taken below
            blocks.pin(block)
        adopted: list[int] = []
        taken: list[int] = []
        try:
            if blocks.blocks_for(len(token_ids)) - len(hits) > blocks.num_free_blocks:
                return 0  # it does not fit yet: admission waits, and asks again
            self.tier.stats.lookups += 1
            keys = self._keys(token_ids, 0, usable)
            slots = self.tier.valid_slots()
            present = list(itertools.takewhile(lambda slot: slot is not None,
                                               (slots.get(key_words(keys[i])) for i in range(len(hits), usable))))
            taken += [blocks.take_pinned() for _ in present]
            arrived = self._read_blocks(list(zip(keys[len(hits) :], present, taken)))
            for i, block, intact in zip(range(len(hits), usable), taken, arrived):
                if not intact:
                    break
                parent = blocks.register(block, parent, token_ids[i * size : (i + 1) * size])
                adopted.append(block)
                if parent is None:  # registered already: the run ends here
                    break
        finally:
            for block in [*hits, *taken]:  # those taken and not read go back to the free list
                blocks.unpin(block)
        stats = self.tier.stats
        stats.hits += bool(adopted)
        stats.misses += not adopted
        stats.tokens_hit += len(adopted) * size
        return len(adopted) * size

    def _read_blocks(self, wanted: list[tuple[bytes, int, int]]) -> list[bool]:
        """Copy each (key, tier slot, pool block) from the tier into its pool block, on up to FILL_THREADS threads
        at once (the reads, checksums and copies run without the GIL): whether each arrived intact."""
        if not wanted:
            return []
        if self._readers is None:
            self._readers = ThreadPoolExecutor(FILL_THREADS, thread_name_prefix="kv-tier-fill")
        parts = min(FILL_THREADS, len(wanted))
        bounds = [len(wanted) * i // parts for i in range(parts + 1)]
        return list(itertools.chain.from_iterable(self._readers.map(
            lambda part: self._read_part(wanted[bounds[part] : bounds[part + 1]]), range(parts))))

    def _read_part(self, wanted: list[tuple[bytes, int, int]]) -> list[bool]:
        self.pool.populate([block for _, _, block in wanted])  # their pages at once, not a fault per 4 KiB
        staging = np.empty(self.tier.block_bytes, np.uint8)  # (block_bytes,)
        arrived = []
        for key, slot, block in wanted:
            intact = self.tier.get(key, slot, staging)
            if intact:
                self._scatter(staging, block, self.pool.block_size)
            arrived.append(intact)
        return arrived

    def fill_partial(self, table: Sequence[int], token_ids: Sequence[int], computed: int) -> int:
        """After allocation with `computed` leading tokens cached (whole blocks): copy the largest partial snapshot
        of the next block that token_ids match (leaving the last token to run) into its fresh block; returns the
        tokens added."""
        size = self.pool.block_size
        index = computed // size
        rows = min(size - 1, len(token_ids) - 1 - computed)
        if computed % size or rows <= 0:
            return 0
        slots = self.tier.valid_slots()
        parent = self._parent(None, token_ids, index)
        for n in range(rows, 0, -1):
            key = self._partial_key(parent, token_ids[computed : computed + n])
            if (slot := slots.get(key_words(key))) is None:
                continue
            data = np.empty(self._row_bytes(n), np.uint8)  # (2 L Hkv n Dh x itemsize,)
            if not self.tier.get(key, slot, data):
                continue
            self._scatter(data, table[index], n)
            self.tier.stats.tokens_hit += n
            return n
        return 0


def tier_layout(pool: KVPool, source: Path) -> dict[str, object]:
    """What a tier's blocks depend on: the model file, the KV numerics, dtype, block size and shapes."""
    return {"model": model_key(source), "numerics": KV_NUMERICS, "dtype": pool.dtype.name,
            "block_size": pool.block_size, "layers": [[k.shape[1], k.shape[4]] for k in pool.keys]}  # (Hkv, Dh)


def open_tier(pool: KVPool, source: Path | None, directory: str, mib: float) -> PoolTier | None:
    """The pool's link to its host tier in `directory` (empty: LLMFLEET_KV_TIER_DIR, else /dev/shm/llmfleet-kv; mib:
    the file's size; 0, no model file or a hybrid model, whose blocks need its recurrent state too: None). A tier
    that cannot be opened (a read-only or full directory) is one log line and None: the worker serves without."""
    if mib <= 0 or source is None or not pool.blocks.enable_prefix_caching or pool.states is not None:
        return None
    try:
        layout = tier_layout(pool, source)
        digest = hashlib.sha256(repr(sorted(layout.items())).encode()).hexdigest()
        path = Path(directory or os.environ.get("LLMFLEET_KV_TIER_DIR") or DEFAULT_DIR) / (
            f"{layout['model']}-{digest[:12]}.kvtier")
        block_bytes = 2 * sum(block_view(k, 0).nbytes for k in pool.keys)  # keys and values of every layer
        tier = TierFile(path, layout, block_bytes, int(mib * (1 << 20)))
    except (OSError, ValueError) as exc:
        log.warning("KV tier in %s is off for this worker: %s (LLMFLEET_KV_TIER_DIR, LLMFLEET_KV_TIER_MIB)",
                    directory or os.environ.get("LLMFLEET_KV_TIER_DIR") or DEFAULT_DIR,
                    getattr(exc, "strerror", None) or exc)
        return None
    log.info("KV tier %s: %d blocks of %d bytes (pid %d)", path, tier.n_slots, tier.block_bytes, os.getpid())
    return PoolTier(pool, tier, hashlib.blake2b(path.name.encode(), digest_size=16).digest())
