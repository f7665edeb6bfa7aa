"""Claiming stalled workers' jobs on a real Redis: an entry read but never taken moves to a live worker after
UNTAKEN_AFTER_S, and its stalled reader's own take is then refused; a taken entry stays with its owner."""

from __future__ import annotations

import time

import pytest
import redis

from shared import keys
from worker.failover import takeover
from worker.failover.fencing import take_ownership
from worker.failover.takeover import claim_stalled, claim_untaken

pytestmark = pytest.mark.integration
STREAM = keys.jobs_stream("m")


@pytest.fixture(autouse=True)
def _short_untaken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(takeover, "UNTAKEN_AFTER_S", 0.2)


def _read(client: redis.Redis, consumer: str, request_id: str) -> str:
    """One job entry (its field names the request), delivered to `consumer`; returns its entry id."""
    entry = client.xadd(STREAM, {keys.JOB_FIELD: request_id.encode()}).decode()
    client.xreadgroup(keys.JOBS_GROUP, consumer, {STREAM: ">"}, count=1)
    return entry


def _request_id(fields: dict) -> str:
    return fields[keys.JOB_FIELD.encode()].decode()


def test_an_entry_read_and_never_taken_moves_to_the_claimer_and_its_reader_is_refused(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = _read(client, "stalled", "r1")
    with monkeypatch.context() as patch:  # a bound far off, so a stalled test machine cannot pass it: just read
        patch.setattr(takeover, "UNTAKEN_AFTER_S", 30.0)
        assert claim_untaken(client, STREAM, "thief", model="m", count=5, request_id_of=_request_id) == []
    time.sleep(0.3)
    claimed = claim_untaken(client, STREAM, "thief", model="m", count=5, request_id_of=_request_id)
    assert [e[0].decode() for e in claimed] == [entry]
    assert take_ownership(client, STREAM, "stalled", "m", [("r1", entry)], ttl_s=60)[0].status == "lost"
    assert take_ownership(client, STREAM, "thief", "m", [("r1", entry)], ttl_s=60)[0].owner == "1:thief"


def test_an_entry_its_reader_took_stays_until_the_lease(client: redis.Redis) -> None:
    entry = _read(client, "busy", "r2")
    take_ownership(client, STREAM, "busy", "m", [("r2", entry)], ttl_s=60)
    time.sleep(0.3)
    assert claim_untaken(client, STREAM, "thief", model="m", count=5, request_id_of=_request_id) == []
    client.set(keys.owner_key("m", "r2"), "done")  # ended, only the ack missing: not claimed either
    assert claim_untaken(client, STREAM, "thief", model="m", count=5, request_id_of=_request_id) == []
    pending = client.xpending_range(STREAM, keys.JOBS_GROUP, min="-", max="+", count=5)
    assert [p["consumer"].decode() for p in pending] == ["busy"]


def test_an_entry_taken_by_an_earlier_owner_and_read_again_by_a_stalled_worker_is_claimed(client: redis.Redis) -> None:
    entry = _read(client, "first", "r3")
    take_ownership(client, STREAM, "first", "m", [("r3", entry)], ttl_s=60)
    client.xclaim(STREAM, keys.JOBS_GROUP, "second", 0, [entry])  # the first died; the second reclaimed it and stopped
    time.sleep(0.3)
    claimed = claim_stalled(client, STREAM, "thief", count=5, ttl_s=60, lease_s=60, model="m", request_id_of=_request_id)
    assert [e[0].decode() for e in claimed] == [entry]


def test_without_a_way_to_name_requests_only_the_lease_applies(client: redis.Redis) -> None:
    _read(client, "stalled", "r4")
    time.sleep(0.3)
    assert claim_stalled(client, STREAM, "thief", count=5, ttl_s=60, lease_s=60) == []
    assert claim_untaken(client, STREAM, "stalled", model="m", count=5, request_id_of=_request_id) == []  # its own entry


def test_an_own_entry_whose_read_lost_its_reply_is_claimed_back_past_the_bound(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(takeover, "LOST_READ_AFTER_S", 30.0)  # far off, so a stalled test machine cannot pass it
    lost = _read(client, "w1", "r5")  # delivered to w1, but the reply never reached it
    taken = _read(client, "w1", "r6")
    take_ownership(client, STREAM, "w1", "m", [("r6", taken)], ttl_s=60)  # running (or ended, the final ack on its way)
    skipped = _read(client, "w1", "r7")  # one the caller takes back on its own (an orphan)
    time.sleep(0.3)  # past UNTAKEN_AFTER_S, within the bound: a reply could still be arriving
    assert claim_untaken(client, STREAM, "w1", model="m", count=5, request_id_of=_request_id, skip=frozenset({skipped})) == []
    monkeypatch.setattr(takeover, "LOST_READ_AFTER_S", 0.3)  # now past it: every entry was read over 0.3 s ago
    claimed = claim_stalled(client, STREAM, "w1", count=5, ttl_s=60, lease_s=60, model="m", request_id_of=_request_id,
                            skip=frozenset({skipped}))
    assert [e[0].decode() for e in claimed] == [lost]  # not the taken one, not the skipped one
    assert take_ownership(client, STREAM, "w1", "m", [("r5", lost)], ttl_s=60)[0].owner == "1:w1"


def test_pending_counts_reads_every_stream_in_one_round_trip(client: redis.Redis) -> None:
    other = keys.jobs_stream("m", "high")
    client.xgroup_create(other, keys.JOBS_GROUP, id="0", mkstream=True)
    _read(client, "w1", "r1")
    _read(client, "w2", "r2")
    client.xadd(other, {keys.JOB_FIELD: b"r3"})  # waiting, not read: nothing pending
    assert takeover.pending_counts(client, [STREAM, other, keys.jobs_stream("never-made")]) == [2, 0, -1]


def test_claim_from_streams_skips_a_forgotten_stream_and_raises_for_a_required_one(client: redis.Redis) -> None:
    gone = keys.jobs_stream("gone")
    assert takeover.claim_from_streams(client, [gone, STREAM], "w9", model="m", count=4, ttl_s=1.0, lease_s=60.0, skip={},
                                       required=set()) == []
    with pytest.raises(redis.ResponseError):
        takeover.claim_from_streams(client, [gone], "w9", model="m", count=4, ttl_s=1.0, lease_s=60.0, skip={}, required={gone})
