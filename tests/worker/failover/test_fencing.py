"""The fencing scripts against a real Redis: owner epochs, refused stale writers, lease renewal, NOSCRIPT."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shared import codec, keys
from shared.messages import DoneEvent, TokenEvent, Usage
from worker.failover.fencing import DONE, Lease, renew_leases, take_ownership
from worker.serve.publisher import EventPublisher

pytestmark = pytest.mark.integration
STREAM = keys.jobs_stream("m")


def _enqueue(client: redis.Redis, consumer: str) -> str:
    """One job entry, delivered to `consumer`; returns its entry id."""
    entry = client.xadd(STREAM, {keys.JOB_FIELD: b"job"}).decode()
    client.xreadgroup(keys.JOBS_GROUP, consumer, {STREAM: ">"}, count=1)
    return entry


def _take(client: redis.Redis, consumer: str, entry: str, rid: str = "r") -> Any:
    return take_ownership(client, STREAM, consumer, "m", [(rid, entry)], ttl_s=60)[0]


def _journal(client: redis.Redis, rid: str = "r") -> list[Any]:
    return [codec.decode_event(f[keys.JOURNAL_EVENT_FIELD.encode()]) for _, f in client.xrange(keys.journal_stream("m", rid))]


def _token(publisher: EventPublisher, text: str, rid: str = "r") -> TokenEvent:
    return TokenEvent(id=rid, seq=publisher.next_seq(rid), text=text, token_ids=[5])


def test_each_taking_gets_the_next_epoch_and_only_the_pending_entrys_consumer_gets_one(client: redis.Redis) -> None:
    entry = _enqueue(client, "a")
    first = _take(client, "a", entry)
    assert (first.status, first.owner, first.epoch, first.previous, first.deliveries) == ("owner", "1:a", 1, "", 1)
    client.xclaim(STREAM, keys.JOBS_GROUP, "b", 0, [entry])  # b takes it over (a second delivery)
    assert _take(client, "a", entry).status == "lost"  # a is no longer the entry's consumer: no epoch for it
    second = _take(client, "b", entry)
    assert (second.owner, second.epoch, second.previous, second.deliveries) == ("2:b", 2, "1:a", 2)
    assert client.get(keys.owner_key("m", "r")) == b"2:b"


def test_a_stale_owner_is_refused_and_writes_nothing(client: redis.Redis, tiny_engine: Any) -> None:
    entry = _enqueue(client, "a")
    stale = EventPublisher(client, tiny_engine.tokenizer, 60, model="m")
    stale.own("r", _take(client, "a", entry).owner, (STREAM, entry))
    stale.add_event(_token(stale, "x"))
    stale.flush()
    assert [e.seq for e in _journal(client)] == [0] and not stale.fenced_off
    client.xclaim(STREAM, keys.JOBS_GROUP, "b", 0, [entry])
    current = _take(client, "b", entry)
    listener = client.pubsub()
    listener.subscribe(keys.events_channel("m", "r"))
    assert listener.get_message(timeout=2)["type"] == "subscribe"
    stale.add_event(_token(stale, "y"))
    stale.add_event(DoneEvent(id="r", seq=stale.next_seq("r"), usage=Usage(prompt_tokens=1, completion_tokens=2,
                                                                           total_tokens=3)))
    stale.flush([(STREAM, entry)])
    assert stale.fenced_off == [("r", current.owner)] and stale.backlog == 0
    assert [e.seq for e in _journal(client)] == [0]  # nothing journaled,
    assert listener.get_message(timeout=0.5) is None  # nothing published,
    assert client.xpending(STREAM, keys.JOBS_GROUP)["pending"] == 1  # nothing acked
    assert client.get(keys.owner_key("m", "r")) == b"2:b"


def test_the_current_owner_writes_events_and_ack_and_the_request_is_then_done(client: redis.Redis,
                                                                             tiny_engine: Any) -> None:
    entry = _enqueue(client, "a")
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60, model="m")
    publisher.own("r", _take(client, "a", entry).owner, (STREAM, entry))
    publisher.add_event(_token(publisher, "x"))
    publisher.add_event(DoneEvent(id="r", seq=publisher.next_seq("r"), usage=Usage(prompt_tokens=1,
                                                                                   completion_tokens=1, total_tokens=2)))
    publisher.flush([(STREAM, entry)])
    assert [e.seq for e in _journal(client)] == [0, 1] and not publisher.fenced_off
    assert client.ttl(keys.journal_stream("m", "r")) > 0
    assert client.xpending(STREAM, keys.JOBS_GROUP)["pending"] == 0 and client.xlen(STREAM) == 0
    assert client.get(keys.owner_key("m", "r")) == DONE.encode()
    assert publisher.next_seq("r") == 0  # forgotten once written


def test_a_taking_after_the_end_is_told_done(client: redis.Redis) -> None:
    entry = _enqueue(client, "a")
    client.set(keys.owner_key("m", "r"), DONE)  # the terminal event was written; say the ack was lost
    assert _take(client, "a", entry).status == "done"
    assert client.get(keys.owner_key("m", "r")) == DONE.encode()


def test_a_missing_owner_key_lets_the_holder_go_on_and_sets_it_again(client: redis.Redis, tiny_engine: Any) -> None:
    """Redis restarted empty: no one else can have taken the job over, so the holder keeps publishing."""
    entry = _enqueue(client, "a")
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60, model="m")
    publisher.own("r", _take(client, "a", entry).owner, (STREAM, entry))
    client.delete(keys.owner_key("m", "r"))
    publisher.add_event(_token(publisher, "x"))
    publisher.flush()
    assert len(_journal(client)) == 1 and client.get(keys.owner_key("m", "r")) == b"1:a"


def test_noscript_reloads_the_scripts_and_nothing_is_lost_or_repeated(client: redis.Redis, tiny_engine: Any) -> None:
    entry = _enqueue(client, "a")
    client.script_flush()
    grant = _take(client, "a", entry)  # NOSCRIPT: loaded, taken once more
    assert grant.status == "owner"
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60, model="m")
    publisher.own("r", grant.owner, (STREAM, entry))
    publisher.add_event(TokenEvent(id="plain", seq=publisher.next_seq("plain"), text="p"))  # not fenced
    publisher.add_event(_token(publisher, "x"))
    client.script_flush()  # as a Redis restart does between two flushes
    publisher.flush()
    assert len(_journal(client, "plain")) == 1 and _journal(client) == [] and publisher.backlog == 1
    publisher.add_event(_token(publisher, "y"))
    publisher.flush()  # the kept event goes first, then the new one; the plain one is not repeated
    assert [e.text for e in _journal(client)] == ["x", "y"] and len(_journal(client, "plain")) == 1
    client.script_flush()
    assert renew_leases(client, STREAM, "a", "m", [Lease(entry, "r", grant.owner, STREAM)]) == []


def test_lease_renewal_refreshes_only_jobs_still_owned(client: redis.Redis) -> None:
    mine, theirs = _enqueue(client, "a"), _enqueue(client, "a")
    mine_owner = _take(client, "a", mine, "mine").owner
    theirs_owner = _take(client, "a", theirs, "theirs").owner
    client.xclaim(STREAM, keys.JOBS_GROUP, "b", 0, [theirs])
    _take(client, "b", theirs, "theirs")
    leases = [Lease(mine, "mine", mine_owner, STREAM), Lease(theirs, "theirs", theirs_owner, STREAM)]
    assert renew_leases(client, STREAM, "a", "m", leases) == [theirs]
    consumers = {row["message_id"].decode(): row["consumer"].decode()
                 for row in client.xpending_range(STREAM, keys.JOBS_GROUP, min="-", max="+", count=10)}
    assert consumers == {mine: "a", theirs: "b"}  # the stale worker did not pull the entry back
    delivered = {row["message_id"].decode(): row["times_delivered"]
                 for row in client.xpending_range(STREAM, keys.JOBS_GROUP, min="-", max="+", count=10)}
    assert delivered[mine] == 1  # a renewal is not a delivery


def test_the_heartbeat_reports_the_jobs_it_no_longer_owns(client: redis.Redis) -> None:
    """A woken worker learns from its next heartbeat, even with nothing to publish, which jobs to drop."""
    from worker.serve.heartbeat import Heartbeat

    entry = _enqueue(client, "a")
    owner = _take(client, "a", entry).owner
    lost: list[tuple[str, str]] = []
    beat = Heartbeat(client, worker_id="a", model="m", slots=1, interval_s=0.5, ttl_s=2.0, gauges=dict,
                     held_jobs=lambda: [Lease(entry, "r", owner, STREAM)], on_lost=lost.extend)
    beat.beat()
    assert lost == []
    client.xclaim(STREAM, keys.JOBS_GROUP, "b", 0, [entry])
    _take(client, "b", entry)
    beat.beat()
    assert lost == [(STREAM, entry)]
