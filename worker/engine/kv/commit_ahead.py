"""Keeping a KV pool's next blocks committed before they are written: a thread that commits, a 2 MiB group at a time,
every group up to a reserve past the highest block the pool has handed out.

A pool's pages are committed as blocks are first written (kv/arena_layout.py): a worker's memory grows with use. What
grows it in one go is a host-tier fill (a failover resuming 8 streams of 2,000 tokens of the synthetic 1B copies
512 MiB into fresh blocks), and committing, which zeroes each page, then sits on the request's path: the kernel
zeroes 8 GB/s here, and a virtual machine's host backs a page on its first touch too (0.7 s for 512 MiB on a
fresh VM, measured). This thread commits the reserve off the step, at start and whenever the high-water mark
grows, so a worker's resident KV is what it used plus the reserve (LLMFLEET_KV_COMMIT_AHEAD_MIB), never more than
its budget.
"""

from __future__ import annotations

import threading

from worker.engine.kv.pool import KVPool

CHECK_S = 0.25  # how often the high-water mark is looked at


class CommitAhead:
    """A daemon thread committing `ahead_bytes` of a pool's blocks past its high-water mark."""

    def __init__(self, pool: KVPool, ahead_bytes: int) -> None:
        self.pool = pool
        per_group = pool.group_blocks
        self.ahead_groups = -(-max(0, ahead_bytes) // (pool.block_bytes * per_group))  # whole groups, rounded up
        self.n_groups = -(-pool.n_blocks // per_group)
        self.committed = 0  # leading groups committed so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-commit-ahead", daemon=True)
        self._thread.start()

    def target(self) -> int:
        """Groups that should be committed now: through the high-water mark's group plus the reserve."""
        high = -(-self.pool.blocks.high_water // self.pool.group_blocks)
        return min(self.n_groups, high + self.ahead_groups)

    def catch_up(self) -> None:
        """Commit every group up to target(), one group per call into the kernel (the GIL released)."""
        while self.committed < self.target() and not self._stop.is_set():
            self.pool.populate_groups(self.committed, self.committed + 1)
            self.committed += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.catch_up()
            self._stop.wait(CHECK_S)

    def stop(self) -> None:
        """End the thread (its last group finishes first)."""
        self._stop.set()
        self._thread.join(timeout=5)
