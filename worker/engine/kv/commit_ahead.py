"""Keeping a KV pool's next blocks committed before they are written: a thread that commits, a 2 MiB group at a time,
every group up to a reserve past the highest block the pool has handed out.

A pool's pages are committed as blocks are first written (kv/arena_layout.py): a worker's memory grows with use. What
grows it in one go is a host-tier fill (a failover resuming 8 streams of 2,000 tokens of the synthetic 1B copies
512 MiB into fresh blocks), and committing, which zeroes each page, then sits on the request's path: the kernel
zeroes 8 GB/s here, and a virtual machine's host backs a page on its first touch too (0.7 s for 512 MiB on a
fresh VM, measured). This thread commits the reserve off the step, at start and whenever the high-water mark
grows, so a worker's resident KV is what it used plus the reserve (LLMFLEET_KV_COMMIT_AHEAD_MIB, off by default:
a worker's memory is then what it used), never more than its budget.
"""

from __future__ import annotations

import threading
import weakref

from worker.engine.kv.pool import KVPool

CHECK_S = 0.25  # how often the high-water mark is looked at


class CommitAhead:
    """A daemon thread committing `ahead_bytes` of a pool's blocks past its high-water mark; it holds the pool weakly
    and ends once the pool is gone (or at stop())."""

    def __init__(self, pool: KVPool, ahead_bytes: int) -> None:
        self._pool = weakref.ref(pool)
        per_group = pool.group_blocks
        self.ahead_groups = -(-max(0, ahead_bytes) // (pool.block_bytes * per_group))  # whole groups, rounded up
        self.n_groups = -(-pool.n_blocks // per_group)
        self.committed = 0  # leading groups committed so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-commit-ahead", daemon=True)
        self._thread.start()

    def target(self) -> int:
        """Groups that should be committed now: through the high-water mark's group plus the reserve (0: no pool)."""
        pool = self._pool()
        if pool is None:
            return 0
        return min(self.n_groups, -(-pool.blocks.high_water // pool.group_blocks) + self.ahead_groups)

    def _catch_up(self) -> bool:
        """Commit every group up to target(), one group per call into the kernel (the GIL released); False once the
        pool is gone."""
        while self.committed < self.target() and not self._stop.is_set():
            pool = self._pool()
            if pool is None:
                return False
            pool.populate_groups(self.committed, self.committed + 1)
            del pool
            self.committed += 1
        return self._pool() is not None

    def _run(self) -> None:
        while not self._stop.is_set() and self._catch_up():
            self._stop.wait(CHECK_S)

    @property
    def running(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """End the thread (its last group finishes first)."""
        self._stop.set()
        self._thread.join(timeout=5)
