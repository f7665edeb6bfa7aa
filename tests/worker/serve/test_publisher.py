"""The publisher never loses an event to a failed transaction: it keeps them, in order, until one succeeds."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import codec, keys
from shared.messages import DoneEvent, TokenEvent, Usage
from worker.serve.publisher import EventPublisher


class FlakyRedis(fakeredis.FakeRedis):
    """A fake Redis whose next `failures` transactions fail as if the connection dropped."""

    failures = 0

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        owner = self
        real_execute = pipe.execute

        def execute(raise_on_error: bool = True) -> Any:
            if owner.failures > 0:
                owner.failures -= 1
                pipe.reset()
                raise RedisConnectionError("simulated: connection lost")
            return real_execute(raise_on_error)

        pipe.execute = execute
        return pipe


def _journal(client: FlakyRedis, rid: str) -> list[Any]:
    return [codec.decode_event(fields[keys.JOURNAL_EVENT_FIELD.encode()])
            for _, fields in client.xrange(keys.journal_stream("m", rid))]


def test_failed_flushes_keep_events_and_acks_in_order(tiny_engine: Any) -> None:
    client = FlakyRedis()
    client.xgroup_create(keys.jobs_stream("m"), keys.JOBS_GROUP, id="0", mkstream=True)
    entry = client.xadd(keys.jobs_stream("m"), {"job": b"x"}).decode()
    client.xreadgroup(keys.JOBS_GROUP, "w", {keys.jobs_stream("m"): ">"})
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60, model="m")
    client.failures = 2
    publisher.add_event(TokenEvent(id="r", seq=publisher.next_seq("r"), text="a", token_ids=[5]))
    with pytest.raises(RedisConnectionError):
        publisher.flush()
    publisher.add_event(TokenEvent(id="r", seq=publisher.next_seq("r"), text="b", token_ids=[6]))
    publisher.add_event(DoneEvent(id="r", seq=publisher.next_seq("r"), usage=Usage(prompt_tokens=1, completion_tokens=2,
                                                                                   total_tokens=3)))
    with pytest.raises(RedisConnectionError):
        publisher.flush([(keys.jobs_stream("m"), entry)])
    assert publisher.backlog == 4 and client.xlen(keys.journal_stream("m", "r")) == 0
    assert client.xpending(keys.jobs_stream("m"), keys.JOBS_GROUP)["pending"] == 1  # not acked yet
    publisher.flush()  # Redis is back: everything goes, in order, the ack after the terminal event
    events = _journal(client, "r")
    assert [e.seq for e in events] == [0, 1, 2] and [getattr(e, "text", None) for e in events[:2]] == ["a", "b"]
    assert isinstance(events[-1], DoneEvent) and publisher.backlog == 0
    assert client.xpending(keys.jobs_stream("m"), keys.JOBS_GROUP)["pending"] == 0
    assert publisher.next_seq("r") == 0  # a finished request's numbering is forgotten only once it is written


def test_a_refused_ack_does_not_make_the_events_repeat(tiny_engine: Any) -> None:
    """Redis runs the transaction but refuses the ack (here WRONGTYPE): the events went out, once."""
    client = FlakyRedis()
    client.set(keys.jobs_stream("gone"), b"not a stream")
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60, model="m")
    publisher.add_event(DoneEvent(id="r", seq=publisher.next_seq("r"), usage=Usage(prompt_tokens=1, completion_tokens=0,
                                                                                   total_tokens=1)))
    publisher.flush([(keys.jobs_stream("gone"), "1-0")])
    assert publisher.backlog == 0
    publisher.flush()
    assert len(_journal(client, "r")) == 1


def test_a_full_redis_keeps_every_owned_event_until_it_accepts_writes_again(tiny_engine: Any, redis_server: Any) -> None:
    """Redis at maxmemory (noeviction) refuses the fenced publish (the journal's XADD): nothing is dropped; once it
    accepts writes the events go out once, in order, and the job is acked (a real redis-server)."""
    import redis
    from redis.exceptions import ResponseError

    from shared.redis_commands import write_refusal
    from worker.failover.fencing import take_ownership

    client = redis.Redis.from_url(redis_server.url)
    stream = keys.jobs_stream("m")
    client.xgroup_create(stream, keys.JOBS_GROUP, id="0", mkstream=True)
    entry = client.xadd(stream, {"job": b"x"}).decode()
    client.xreadgroup(keys.JOBS_GROUP, "w", {stream: ">"})
    [grant] = take_ownership(client, stream, "w", "m", [("r", entry)], ttl_s=60)
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60, model="m")
    publisher.own("r", grant.owner, (stream, entry))
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        for text in ("a", "b"):
            publisher.add_event(TokenEvent(id="r", seq=publisher.next_seq("r"), text=text, token_ids=[5]))
            with pytest.raises(ResponseError) as refused:
                publisher.flush()
            assert write_refusal(refused.value) == "OOM"
        publisher.add_event(DoneEvent(id="r", seq=publisher.next_seq("r"),
                                      usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)))
        with pytest.raises(ResponseError):
            publisher.flush([(stream, entry)])
        assert publisher.backlog > 0 and client.xlen(keys.journal_stream("m", "r")) == 0
    finally:
        client.config_set("maxmemory", 0)
    publisher.flush()
    events = _journal(client, "r")
    assert [e.seq for e in events] == [0, 1, 2] and [getattr(e, "text", None) for e in events[:2]] == ["a", "b"]
    assert publisher.backlog == 0 and client.get(keys.owner_key("m", "r")) == b"done"
    assert client.xpending(stream, keys.JOBS_GROUP)["pending"] == 0
