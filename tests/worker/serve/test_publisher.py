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
            for _, fields in client.xrange(keys.journal_stream(rid))]


def test_failed_flushes_keep_events_and_acks_in_order(tiny_engine: Any) -> None:
    client = FlakyRedis()
    client.xgroup_create(keys.jobs_stream("m"), keys.JOBS_GROUP, id="0", mkstream=True)
    entry = client.xadd(keys.jobs_stream("m"), {"job": b"x"}).decode()
    client.xreadgroup(keys.JOBS_GROUP, "w", {keys.jobs_stream("m"): ">"})
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60)
    client.failures = 2
    publisher.add_event(TokenEvent(id="r", seq=publisher.next_seq("r"), text="a", token_ids=[5]))
    with pytest.raises(RedisConnectionError):
        publisher.flush()
    publisher.add_event(TokenEvent(id="r", seq=publisher.next_seq("r"), text="b", token_ids=[6]))
    publisher.add_event(DoneEvent(id="r", seq=publisher.next_seq("r"), usage=Usage(prompt_tokens=1, completion_tokens=2,
                                                                                   total_tokens=3)))
    with pytest.raises(RedisConnectionError):
        publisher.flush([(keys.jobs_stream("m"), entry)])
    assert publisher.backlog == 4 and client.xlen(keys.journal_stream("r")) == 0
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
    publisher = EventPublisher(client, tiny_engine.tokenizer, 60)
    publisher.add_event(DoneEvent(id="r", seq=publisher.next_seq("r"), usage=Usage(prompt_tokens=1, completion_tokens=0,
                                                                                   total_tokens=1)))
    publisher.flush([(keys.jobs_stream("gone"), "1-0")])
    assert publisher.backlog == 0
    publisher.flush()
    assert len(_journal(client, "r")) == 1
