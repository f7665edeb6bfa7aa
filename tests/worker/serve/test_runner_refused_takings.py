"""A job read and claimed many times while Redis refused every taking of it is not a poison job (worker/serve/
job_feeder.py counts takings, owner epochs, toward LLMFLEET_MAX_DELIVERIES, not reads)."""

from __future__ import annotations

from typing import Any

import redis

from shared import keys
from shared.messages import ErrorEvent
from shared.settings import Settings
from tests.support.job_events import run_until_collected, submit
from tests.worker.serve.test_runner import MODEL, job
from worker.serve.runner import WorkerRunner


def test_reads_whose_taking_redis_refused_do_not_count_toward_dead_lettering(tiny_engine: Any, client: redis.Redis,
                                                                            settings: Settings) -> None:
    """A job read and claimed many times while Redis refused every taking (OOM: XREADGROUP and XCLAIM pass at
    maxmemory, the owner's SET does not) never ran: taken now for the first time, it runs to its end."""
    stream = keys.jobs_stream(MODEL)
    live = WorkerRunner(tiny_engine, client, settings, model=MODEL)
    live.ensure_group()
    pubsub = submit(client, job("unlucky", max_tokens=3))
    entry = client.xreadgroup(keys.JOBS_GROUP, live.worker_id, {stream: ">"}, count=1)[0][1][0][0]
    for _ in range(2 * settings.max_deliveries):  # the worker's own claims back of a taking that failed
        client.xclaim(stream, keys.JOBS_GROUP, live.worker_id, 0, [entry])
    assert client.xpending_range(stream, keys.JOBS_GROUP, "-", "+", 1)[0]["times_delivered"] > settings.max_deliveries
    events = run_until_collected(live, pubsub)
    assert not any(isinstance(e, ErrorEvent) for e in events) and len(events) >= 2
    assert client.xlen(keys.deadletter_stream(MODEL)) == 0
    assert client.get(keys.owner_key(MODEL, "unlucky")) == b"done"
