"""Finding a suspect worker's jobs on a real Redis: a registry entry not renewed for two heartbeat intervals makes
its holder suspect, its pending generations come back with their journals (each once), and nothing is claimed; a
live worker, an expired one (the reclaim's), a finished job and a non-generation are left alone."""

from __future__ import annotations

import time

import pytest
import redis

from shared import codec, keys
from shared.messages import DoneEvent, EmbedJob, GenerateJob, TokenEvent, Usage
from worker.failover.prewarm import TakeoverWarmer, suspect_after_ms, suspect_jobs

pytestmark = pytest.mark.integration
STREAM = keys.jobs_stream("m")


def _held(client: redis.Redis, holder: str, job: GenerateJob | EmbedJob, *events: TokenEvent | DoneEvent) -> None:
    """`job` read by `holder` (pending for it), with these events in its journal."""
    client.xadd(STREAM, {keys.JOB_FIELD: codec.encode_job(job)})
    client.xreadgroup(keys.JOBS_GROUP, holder, {STREAM: ">"}, count=1)
    for event in events:
        client.xadd(keys.journal_stream("m", job.id), {keys.JOURNAL_SEQ_FIELD: str(event.seq),
                                                        keys.JOURNAL_EVENT_FIELD: codec.encode_event(event)})


def _generation(request_id: str) -> GenerateJob:
    return GenerateJob(id=request_id, model="m", created=time.time(), deadline=time.time() + 60, prompt="hi")


def _look(client: redis.Redis, seen: set[str]) -> list[tuple[str, list[int]]]:
    found = suspect_jobs(client, [STREAM], "survivor", model="m", interval_s=0.5, ttl_s=2.0, count=10, seen=seen)
    return [(s.job.id, s.journal.tokens.get(0, [])) for s in found]


def test_a_silent_workers_generations_are_found_once_and_left_pending(client: redis.Redis) -> None:
    _held(client, "quiet", _generation("g1"), TokenEvent(id="g1", seq=0, text="a", token_ids=[7, 8]))
    _held(client, "quiet", _generation("g2"))
    _held(client, "quiet", _generation("g3"), DoneEvent(id="g3", seq=0, usage=Usage(prompt_tokens=1,
                                                                                      completion_tokens=0,
                                                                                      total_tokens=1)))
    _held(client, "quiet", EmbedJob(id="e1", model="m", created=time.time(), deadline=time.time() + 60,
                                    inputs=["x"]))
    _held(client, "busy", _generation("g4"))
    client.set(keys.worker_key("quiet"), "x", px=2000)
    client.set(keys.worker_key("busy"), "x", px=2000)
    seen: set[str] = set()
    assert _look(client, seen) == []  # both renewed just now
    client.pexpire(keys.worker_key("quiet"), 900)  # its last beat was 1.1 s ago: two intervals missed
    assert _look(client, seen) == [("g1", [7, 8]), ("g2", [])]  # not the finished one, nor the embedding
    assert _look(client, seen) == []  # each once
    pending = client.xpending_range(STREAM, keys.JOBS_GROUP, min="-", max="+", count=10, consumername="quiet")
    assert len(pending) == 4  # nothing claimed
    client.delete(keys.worker_key("quiet"))  # expired: the reclaim takes its jobs, not this
    assert _look(client, set()) == []


def test_the_warmer_hands_what_it_found_to_the_loop_oldest_first(client: redis.Redis) -> None:
    for request_id in ("a", "b", "c"):
        _held(client, "quiet", _generation(request_id))
    client.set(keys.worker_key("quiet"), "x", px=500)
    warmer = TakeoverWarmer(model="m", worker_id="survivor", interval_s=0.5, ttl_s=2.0)
    assert warmer.look(client, [STREAM], 10) and not warmer.look(client, [STREAM], 10)
    assert [s.job.id for s in warmer.drain(1)] == ["a"]
    assert [s.job.id for s in warmer.drain()] == ["b", "c"] and warmer.drain() == []


def test_a_ttl_without_room_for_two_missed_beats_never_suspects() -> None:
    assert suspect_after_ms(0.5, 2.0) == 1000 and suspect_after_ms(0.5, 2.5) == 1000  # the entry's TTL is whole s
    assert suspect_after_ms(0.5, 1.0) == 0
