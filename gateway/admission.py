"""Admission by work: how long a new request would wait for a slot, from the queue and the workers' finish rate.

Each worker publishes `stat.finish_rate` (requests ended per second, smoothed over ~30 s) with its heartbeat.
A request that would wait longer than a share of its deadline is refused at once with 429 and a Retry-After
from the same estimate, instead of being admitted to time out in the queue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shared.registry import RegistryEntry

WAIT_SHARE_OF_DEADLINE = 0.5  # admit while the expected wait for a slot is under this share of the deadline
MAX_RETRY_AFTER_S = 60


def expected_wait_s(workers: Sequence[RegistryEntry], waiting: int) -> float:
    """Seconds until a request queued behind `waiting` others gets a slot; 0 when a slot is free or no worker
    has measured its rate yet (then only the queue's count limit applies)."""
    free = sum(max(0, w.slots - w.load) for w in workers)
    ahead = waiting - free + 1  # requests that must finish before this one starts
    rate = sum(w.stats.get("finish_rate", 0.0) for w in workers)
    if ahead <= 0 or rate <= 0:
        return 0.0
    return ahead / rate


def retry_after_s(expected_wait: float, budget: float) -> float:
    """When trying again may be admitted: once the queue has shrunk below the budget (1 to 60 s)."""
    return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(expected_wait - budget))))
