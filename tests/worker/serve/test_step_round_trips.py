"""A decode step never waits on Redis: the loop's thread makes no round trip while sequences decode, and the
publisher thread makes at most one per step (a structural count through a counting connection, not a timing)."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import fakeredis
import pytest
import redis

from shared import codec, keys
from shared.messages import DoneEvent, GenerateJob, Sampling, TokenEvent
from shared.settings import Settings
from tests.support.job_events import collect, submit
from worker.serve.publish_sender import BatchSender, RequestWrite, StepBatch
from worker.serve.runner import WorkerRunner

MODEL = "tiny"
LOOP_THREAD = "worker-loop"


class CountingConnection(redis.Connection):
    """A connection that counts the requests it sends (a pipeline is one), per sending thread."""

    sent: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with CountingConnection.lock:
            CountingConnection.sent[threading.current_thread().name] += 1
        super().send_packed_command(command, check_health)


def _counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)


@pytest.mark.integration
@pytest.mark.parametrize("slots", [1, 4])
def test_decode_steps_make_no_round_trip_on_the_loop_and_at_most_one_each_on_the_publisher(
        tiny_engine: Any, client: redis.Redis, settings: Settings, redis_server: Any, slots: int) -> None:
    runner = WorkerRunner(tiny_engine, _counting_client(redis_server.url), dataclasses.replace(settings, slots=slots),
                          model=MODEL)
    thread = threading.Thread(target=runner.run, name=LOOP_THREAD, daemon=True)
    thread.start()
    assert runner.ready.wait(10)
    try:
        now = time.time()
        message = GenerateJob(id="counted", model=MODEL, created=now, deadline=now + 60, prompt_token_ids=[5, 6, 7],
                              max_tokens=300, ignore_eos=True,
                              sampling=Sampling(temperature=0.8, seed=1))  # sampled: one token per step
        with CountingConnection.lock:  # idle: no step runs and the publisher has nothing to send
            CountingConnection.sent.clear()
        steps_before, sends_before = runner.scheduler.stats.steps, runner.publisher.sender.sends
        pubsub = submit(client, message)
        events = collect(pubsub)
        steps = runner.scheduler.stats.steps - steps_before  # every step of the job, prefill included
        with CountingConnection.lock:
            sent = dict(CountingConnection.sent)
        transactions = runner.publisher.sender.sends - sends_before
    finally:
        runner.stop_requested.set()
        thread.join(timeout=10)
    assert isinstance(events[-1], DoneEvent) and sum(isinstance(e, TokenEvent) for e in events) == 300
    assert steps >= 250  # the counts below are per step
    assert sent.get(LOOP_THREAD, 0) == 0, sent  # the step loop itself never waited on Redis
    # one transaction per step at most (fewer: merged); the connection's own set-up commands (CLIENT SETINFO
    # on a fresh pooled connection) are sends of the thread but not transactions, so they are not counted here
    assert 1 <= transactions <= steps, (transactions, steps, sent)


def _write(rid: str, seq: int, text: str) -> StepBatch:
    return StepBatch([RequestWrite(rid, "", [TokenEvent(id=rid, seq=seq, text=text, token_ids=[5])])])


def test_batches_waiting_together_go_in_one_transaction_in_step_order() -> None:
    client = fakeredis.FakeRedis()
    sender = BatchSender(client, 60, model=MODEL, max_steps=3)
    for seq, text in enumerate("abc"):
        assert sender.room()
        sender.submit(_write("r", seq, text))
    assert not sender.room()  # three steps wait unsent: the step loop must wait (backpressure)
    sender.send_now()
    assert sender.sends == 1 and sender.room() and sender.backlog == 0
    journal = [codec.decode_event(f[keys.JOURNAL_EVENT_FIELD.encode()])
               for _, f in client.xrange(keys.journal_stream(MODEL, "r"))]
    assert [e.text for e in journal] == ["a", "b", "c"] and [e.seq for e in journal] == [0, 1, 2]


def test_the_publisher_thread_catches_up_when_redis_is_slow() -> None:
    """Redis answers slowly: steps keep being sealed, and each round trip carries every step waiting."""

    class SlowRedis(fakeredis.FakeRedis):
        def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
            pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
            real_execute = pipe.execute

            def execute(raise_on_error: bool = True) -> Any:
                time.sleep(0.05)  # a 50 ms round trip
                return real_execute(raise_on_error)

            pipe.execute = execute
            return pipe

    client = SlowRedis()
    sender = BatchSender(client, 60, model=MODEL, max_steps=1000)
    sender.start()
    for seq in range(40):  # 40 steps sealed much faster than 40 round trips
        sender.submit(_write("r", seq, str(seq)))
        time.sleep(0.005)
    assert sender.close(timeout_s=10)
    assert 2 <= sender.sends <= 12  # several steps per transaction
    assert [int(f[keys.JOURNAL_SEQ_FIELD.encode()]) for _, f in client.xrange(keys.journal_stream(MODEL, "r"))] \
        == list(range(40))
