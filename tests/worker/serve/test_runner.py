"""The worker loop against a real Redis: jobs in, numbered events out, acks, cancels, deadlines, reclaims."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared import codec, keys
from shared.messages import (
    CancelRequest,
    ChatMessage,
    ChoiceEndEvent,
    DoneEvent,
    EmbedJob,
    ErrorEvent,
    GenerateJob,
    OutputConstraint,
    Sampling,
    TokenEvent,
    ToolSpec,
)
from shared.settings import Settings
from tests.support.job_events import collect, run_until_collected, submit
from worker.failover.fencing import take_ownership
from worker.failover.takeover import claim_from_dead_workers
from worker.serve.runner import WorkerRunner

pytestmark = pytest.mark.integration
MODEL = "tiny"


@pytest.fixture()
def worker(tiny_engine: Any, client: redis.Redis, settings: Settings) -> Iterator[WorkerRunner]:
    yield from _running(tiny_engine, client, settings)


def _running(engine: Any, client: redis.Redis, settings: Settings) -> Iterator[WorkerRunner]:
    """A WorkerRunner serving `engine` in a thread, stopped (and joined) afterwards."""
    runner = WorkerRunner(engine, client, settings, model=MODEL)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    assert runner.ready.wait(60)  # the first start compiles the decode kernels (6-7 s alone on a busy 2-core box)
    yield runner
    runner.stop_requested.set()
    thread.join(timeout=10)
    assert not thread.is_alive()


def job(rid: str, **kw: Any) -> GenerateJob:
    now = time.time()
    fields = {"prompt_token_ids": [5, 6, 7], "max_tokens": 5, "ignore_eos": True,
              "sampling": Sampling(temperature=0.0), **kw}
    return GenerateJob(id=rid, model=MODEL, created=now, deadline=kw.pop("deadline", now + 30), **fields)


def test_generate_events_are_numbered_and_terminal_once(worker: WorkerRunner, client: redis.Redis) -> None:
    events = collect(submit(client, job("g1", n=2)))
    assert [e.seq for e in events] == list(range(len(events)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(tokens) == 10 and {e.index for e in tokens} == {0, 1}
    assert [e.finish_reason for e in events if isinstance(e, ChoiceEndEvent)] == ["length", "length"]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.usage.prompt_tokens == 3 and done.usage.completion_tokens == 10
    journal = client.xrange(keys.journal_stream(MODEL, "g1"))
    assert len(journal) == len(events)  # everything published is journaled
    time.sleep(0.3)
    assert client.xpending(keys.jobs_stream(MODEL), keys.JOBS_GROUP)["pending"] == 0  # acked
    assert client.xlen(keys.jobs_stream(MODEL)) == 0  # and deleted: the stream holds only open jobs


def test_registry_entry(worker: WorkerRunner, client: redis.Redis) -> None:
    entry = client.hgetall(keys.worker_key(worker.worker_id))
    assert entry[b"model"] == MODEL.encode() and entry[b"slots"] == b"4" and entry[b"state"] == b"ready"


def test_context_overflow_is_an_error_event(worker: WorkerRunner, client: redis.Redis) -> None:
    events = collect(submit(client, job("big", max_tokens=10_000)))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert events[0].status == 400 and events[0].code == "context_length_exceeded"


def test_cancel_frees_the_slot(worker: WorkerRunner, client: redis.Redis) -> None:
    pubsub = submit(client, job("c1", max_tokens=1500))
    first = None
    while first is None:
        msg = pubsub.get_message(timeout=5)
        if msg and msg["type"] == "message":
            first = codec.decode_event(msg["data"])
    client.publish(keys.cancel_channel(MODEL), codec.encode(CancelRequest(id="c1", model=MODEL, reason="test")))
    events = collect(pubsub)
    assert any(isinstance(e, ChoiceEndEvent) and e.finish_reason == "cancelled" for e in events)
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens < 1500
    assert worker.scheduler.stats.active == 0


def test_expired_deadline(worker: WorkerRunner, client: redis.Redis) -> None:
    now = time.time()
    late = GenerateJob(id="late", model=MODEL, created=now - 10, deadline=now - 1, prompt_token_ids=[5])
    events = collect(submit(client, late))
    assert isinstance(events[-1], ErrorEvent) and events[-1].status == 504


def test_embeddings_of_a_causal_model_when_the_deployment_opts_in(tiny_engine: Any, client: redis.Redis,
                                                                   settings: Settings) -> None:
    """LLMFLEET_CAUSAL_EMBEDDINGS=1: the tiny (causal) model pools its hidden states, as before the opt-in."""
    for _ in _running(tiny_engine, client, dataclasses.replace(settings, causal_embeddings=1)):
        now = time.time()
        events = collect(submit(client, EmbedJob(id="e1", model=MODEL, created=now, deadline=now + 30,
                                                 inputs=[[5, 6, 7], [8, 9]])))
        done = events[-1]
        assert isinstance(done, DoneEvent) and len(done.embeddings) == 2 and done.usage.prompt_tokens == 5
        for vector in done.embeddings:
            assert abs(sum(x * x for x in vector) - 1.0) < 1e-4


def test_embeddings_of_a_causal_model_are_a_400_ended_once(worker: WorkerRunner, client: redis.Redis) -> None:
    now = time.time()
    events = collect(submit(client, EmbedJob(id="e2", model=MODEL, created=now, deadline=now + 30,
                                             inputs=["a", "b"])))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    error = events[0]
    assert (error.status, error.type, error.param) == (400, "invalid_request_error", "model")
    assert f"{MODEL!r} is a generative model" in error.message and "LLMFLEET_CAUSAL_EMBEDDINGS=1" in error.message
    assert client.xlen(keys.journal_stream(MODEL, "e2")) == 1  # the one terminal event, journaled
    time.sleep(0.3)
    assert client.xpending(keys.jobs_stream(MODEL), keys.JOBS_GROUP)["pending"] == 0  # acked: not redelivered
    assert worker.scheduler.stats.active == 0


def test_job_of_a_dead_worker_is_reclaimed_and_ends(tiny_engine: Any, client: redis.Redis, settings: Settings) -> None:
    dead = WorkerRunner(tiny_engine, client, settings, model=MODEL, worker_id="dead")
    dead.ensure_group()
    pubsub = submit(client, job("orphan"))
    # the dead worker takes the job and is never heard of again
    assert client.xreadgroup(keys.JOBS_GROUP, "dead", {keys.jobs_stream(MODEL): ">"}, count=1)
    live = WorkerRunner(tiny_engine, client, settings, model=MODEL)
    thread = threading.Thread(target=live.run, daemon=True)
    thread.start()
    try:
        events = collect(pubsub, timeout=30)
        assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 5
    finally:
        live.stop_requested.set()
        thread.join(timeout=10)


def test_a_job_that_breaks_intake_fails_alone(worker: WorkerRunner, client: redis.Redis,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import worker.serve.intake as intake_module

    real = intake_module.generation_request

    def flaky(engine: Any, job: GenerateJob, **kw: Any) -> Any:
        if job.id == "boom":
            raise RuntimeError("simulated bug")
        return real(engine, job, **kw)

    monkeypatch.setattr(intake_module, "generation_request", flaky)
    events = collect(submit(client, job("boom")))
    assert isinstance(events[-1], ErrorEvent) and events[-1].status == 500 and "simulated" not in events[-1].message
    assert isinstance(collect(submit(client, job("after")))[-1], DoneEvent)  # the worker lives on


def test_worker_recovers_when_redis_restarts_empty(tiny_engine: Any, redis_server: Any, settings: Settings) -> None:
    """No NOGROUP loop: the worker recreates its stream and group and serves the next job by itself."""
    from llmfleet.redis_server import BundledRedis

    client = redis.Redis.from_url(redis_server.url, socket_connect_timeout=1)
    runner = WorkerRunner(tiny_engine, client, settings, model=MODEL)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    assert runner.ready.wait(10)
    replacement = None
    try:
        assert isinstance(collect(submit(client, job("before")))[-1], DoneEvent)
        redis_server.stop()
        time.sleep(1.0)  # the worker sees connection errors meanwhile
        replacement = BundledRedis(port=redis_server.port).start()  # same port, no data
        started = time.monotonic()
        events = collect(submit(client, job("after")), timeout=30)  # no group: only the worker can recreate it
        assert isinstance(events[-1], DoneEvent)
        assert time.monotonic() - started < 15
    finally:
        runner.stop_requested.set()
        thread.join(timeout=15)
        if replacement is not None:
            replacement.stop()


@pytest.mark.parametrize(("sampling", "param"), [(Sampling(min_p=7.0), "min_p"),
                                                  (Sampling(repetition_penalty=-1.0), "repetition_penalty"),
                                                  (Sampling(top_k=-5), "top_k")])
def test_out_of_range_sampling_is_a_400_event(worker: WorkerRunner, client: redis.Redis, sampling: Sampling,
                                              param: str) -> None:
    """The wire carries any value; the engine's SamplingParams.validate is the one range check."""
    events = collect(submit(client, job(f"bad-{param}", sampling=sampling)))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert (events[0].status, events[0].param) == (400, param)


def test_the_stop_string_that_ended_a_choice_is_on_its_choice_end(worker: WorkerRunner, client: redis.Redis) -> None:
    """A choice cut by a stop string names it (Anthropic's stop_sequence); one cut by max_tokens names none."""
    free = collect(submit(client, job("stop-free", max_tokens=8)))
    text = "".join(e.text for e in free if isinstance(e, TokenEvent))
    stop = text[len(text) // 2:len(text) // 2 + 2] or text
    assert stop, "the tiny model generated no text"
    events = collect(submit(client, job("stop-cut", max_tokens=8, stop=["never appears \x00", stop])))
    (end,) = [e for e in events if isinstance(e, ChoiceEndEvent)]
    assert end.finish_reason == "stop" and end.stop_sequence == stop
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == text[:text.index(stop)]
    (free_end,) = [e for e in free if isinstance(e, ChoiceEndEvent)]
    assert free_end.finish_reason == "length" and free_end.stop_sequence is None


@pytest.mark.parametrize("echo", [False, True])
def test_max_tokens_zero_ends_with_length_and_no_tokens(worker: WorkerRunner, client: redis.Redis, echo: bool) -> None:
    """OpenAI's completions accept max_tokens 0 (scoring a prompt with echo): no tokens, finish_reason length."""
    events = collect(submit(client, job(f"zero-{echo}", prompt_token_ids=[5, 6, 7], max_tokens=0, n=2, echo=echo)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert all(e.echo for e in tokens) and len(tokens) == (2 if echo else 0)
    assert [e.finish_reason for e in events if isinstance(e, ChoiceEndEvent)] == ["length", "length"]
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 0
    assert events[-1].usage.prompt_tokens == 3
    assert [e.seq for e in events] == list(range(len(events)))


def test_a_dead_workers_idle_consumer_is_forgotten(tiny_engine: Any, client: redis.Redis, settings: Settings) -> None:
    """A consumer with nothing pending and no registry entry, idle past the lease, leaves the group."""
    live = WorkerRunner(tiny_engine, client, settings, model=MODEL)
    live.ensure_group()
    client.xreadgroup(keys.JOBS_GROUP, "long-gone", {keys.jobs_stream(MODEL): ">"}, count=1)  # creates it
    time.sleep(settings.lease_s + 0.2)
    claim_from_dead_workers(client, keys.jobs_stream(MODEL), live.worker_id, count=4, ttl_s=settings.heartbeat_ttl_s,
                            lease_s=settings.lease_s)
    names = [c["name"] for c in client.xinfo_consumers(keys.jobs_stream(MODEL), keys.JOBS_GROUP)]
    assert b"long-gone" not in names and "long-gone" not in names


def test_a_worker_whose_job_was_taken_over_is_fenced_off(worker: WorkerRunner, client: redis.Redis,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Once another worker owns the request (a new epoch), this one writes nothing more and acks nothing."""
    pubsub = submit(client, job("fenced", max_tokens=1500))
    while (first := pubsub.get_message(timeout=5)) is None or first["type"] != "message":
        pass  # wait until the worker is under way
    stream = keys.jobs_stream(MODEL)
    entry = client.xpending_range(stream, keys.JOBS_GROUP, min="-", max="+", count=1)[0]["message_id"].decode()

    def other_worker_holds_it() -> None:  # a live worker that took the job over: registered, renewing its lease
        client.hset(keys.worker_key("other"), mapping={"model": MODEL, "heartbeat": time.time()})
        client.xclaim(stream, keys.JOBS_GROUP, "other", 0, [entry], justid=True)

    other_worker_holds_it()
    grant = take_ownership(client, stream, "other", MODEL, [("fenced", entry)], ttl_s=60)[0]
    assert grant.epoch == 2 and grant.previous.endswith(":" + worker.worker_id)
    deadline = time.monotonic() + 10
    while "fenced" in worker._held and time.monotonic() < deadline:
        other_worker_holds_it()
        time.sleep(0.05)
    assert "fenced" not in worker._held and worker.scheduler.stats.active == 0
    seen = client.xlen(keys.journal_stream(MODEL, "fenced"))
    for _ in range(10):
        other_worker_holds_it()
        time.sleep(0.05)
    assert client.xlen(keys.journal_stream(MODEL, "fenced")) == seen  # the stale worker wrote nothing more
    pending = client.xpending_range(stream, keys.JOBS_GROUP, min="-", max="+", count=5)
    assert [(p["message_id"].decode(), p["consumer"]) for p in pending] == [(entry, b"other")]  # nor acked it
    assert client.get(keys.owner_key(MODEL, "fenced")) == grant.owner.encode()
    assert "fenced off: job fenced" in caplog.text


def test_a_poison_job_is_dead_lettered_and_its_client_told(tiny_engine: Any, client: redis.Redis,
                                                           settings: Settings) -> None:
    """A job delivered max_deliveries times without an ack (each holder died on it) is set aside, with an error
    event numbered after what its clients already saw."""
    stream = keys.jobs_stream(MODEL)
    live = WorkerRunner(tiny_engine, client, settings, model=MODEL)
    live.ensure_group()
    pubsub = submit(client, job("poison"))
    entry = client.xreadgroup(keys.JOBS_GROUP, "ghost-1", {stream: ">"}, count=1)[0][1][0][0]
    take_ownership(client, stream, "ghost-1", MODEL, [("poison", entry.decode())], ttl_s=60)
    for ghost in ("ghost-2", "ghost-3"):  # two takeovers, each holder died too: three takings
        client.xclaim(stream, keys.JOBS_GROUP, ghost, 0, [entry])
        take_ownership(client, stream, ghost, MODEL, [("poison", entry.decode())], ttl_s=60)
    client.xadd(keys.journal_stream(MODEL, "poison"), {"seq": "0", "event": codec.encode_event(
        TokenEvent(id="poison", seq=0, text="a", token_ids=[5]))})  # what the first holder got out
    events = run_until_collected(live, pubsub)
    assert len(events) == 1 and isinstance(events[0], ErrorEvent) and events[0].seq == 1
    assert (events[0].status, events[0].code, events[0].retry_after) == (500, "dead_lettered", None)
    dead = client.xrange(keys.deadletter_stream(MODEL))
    assert len(dead) == 1 and dead[0][1][b"deliveries"] == b"3" and dead[0][1][b"worker"] == live.worker_id.encode()
    assert codec.decode_job(dead[0][1][keys.JOB_FIELD.encode()]).id == "poison"
    assert client.xpending(stream, keys.JOBS_GROUP)["pending"] == 0 and client.xlen(stream) == 0


@pytest.mark.parametrize(("constraint", "message"), [
    (OutputConstraint(kind="json_schema", source='{"type": "strin"}', param="response_format.json_schema.schema"),
     "Invalid type: strin"),
    (OutputConstraint(kind="json_schema", source='{"not": {}}', param="json_schema"), "Unimplemented keys"),
    (OutputConstraint(kind="regex", source="[a-", param="regex"), "unclosed character class"),
])
def test_a_constraint_that_does_not_compile_is_a_400_naming_its_field(worker: WorkerRunner, client: redis.Redis,
                                                                     constraint: OutputConstraint, message: str) -> None:
    events = collect(submit(client, job(f"bad-{constraint.param}", constraint=constraint)))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert (events[0].status, events[0].param) == (400, constraint.param)
    assert message in events[0].message and constraint.param in events[0].message


def test_a_constrained_job_ends_with_stop_when_its_grammar_is_complete(worker: WorkerRunner,
                                                                     client: redis.Redis) -> None:
    constraint = OutputConstraint(kind="regex", source="(yes|no)!", param="regex")
    events = collect(submit(client, job("yes-no", constraint=constraint, max_tokens=50, n=2,
                                        sampling=Sampling(temperature=1.0, seed=3))))
    texts = ["".join(e.text for e in events if isinstance(e, TokenEvent) and e.index == i) for i in (0, 1)]
    assert all(text in ("yes!", "no!") for text in texts)
    assert [e.finish_reason for e in events if isinstance(e, ChoiceEndEvent)] == ["stop", "stop"]


@pytest.fixture()
def chat_worker(tiny_chat_engine: Any, client: redis.Redis, settings: Settings) -> Iterator[WorkerRunner]:
    yield from _running(tiny_chat_engine, client, settings)


def _chat_job(rid: str, **kw: Any) -> GenerateJob:
    return job(rid, prompt_token_ids=None, messages=[ChatMessage(role="user", content="weather in Oslo?")], **kw)


def test_a_tool_whose_schema_does_not_compile_is_named(chat_worker: WorkerRunner, client: redis.Redis) -> None:
    tools = [ToolSpec(name="ok", parameters='{"type":"object"}'), ToolSpec(name="bad", parameters='{"type":"nope"}')]
    events = collect(submit(client, _chat_job("bad-tool", tools=tools)))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert (events[0].status, events[0].param) == (400, "tools[1].function.parameters")


def test_a_required_tool_call_is_made_from_the_first_token(chat_worker: WorkerRunner, client: redis.Redis) -> None:
    params = '{"type":"object","properties":{"city":{"enum":["Oslo","Rome"]}},"required":["city"],"additionalProperties":false}'
    events = collect(submit(client, _chat_job("tool", tools=[ToolSpec(name="get_weather", parameters=params)],
                                              tool_choice="required", parallel_tool_calls=False, max_tokens=400,
                                              ignore_eos=False)))
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text.startswith("<tool_call>") and text.rstrip().endswith("</tool_call>")
    call = json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    assert call["name"] == "get_weather" and call["arguments"]["city"] in ("Oslo", "Rome")
    assert [e.finish_reason for e in events if isinstance(e, ChoiceEndEvent)] == ["stop"]


def test_a_drain_past_its_timeout_leaves_held_jobs_to_other_workers(tiny_engine: Any, client: redis.Redis,
                                                                     settings: Settings) -> None:
    """SIGTERM drains; a job still running after LLMFLEET_DRAIN_TIMEOUT_S stays unacked for a takeover."""
    runner = WorkerRunner(tiny_engine, client, dataclasses.replace(settings, drain_timeout_s=0.5), model=MODEL)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    assert runner.ready.wait(10)
    pubsub = submit(client, job("long", max_tokens=1500))
    while (first := pubsub.get_message(timeout=5)) is None or first["type"] != "message":
        pass  # under way
    runner.stop_requested.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    pending = client.xpending_range(keys.jobs_stream(MODEL), keys.JOBS_GROUP, min="-", max="+", count=5)
    assert [p["consumer"].decode() for p in pending] == [runner.worker_id]  # not acked: another worker resumes it
    assert not client.exists(keys.worker_key(runner.worker_id))  # deregistered: the takeover can start at once


@pytest.mark.parametrize("low_on", ["shared", "own"])
def test_a_critical_job_starts_before_fifty_queued_low_ones(tiny_engine: Any, client: redis.Redis,
                                                            settings: Settings, low_on: str) -> None:
    """Priority holds across the queue, not only among jobs a worker already took: one stream per class,
    read highest first, also when the low jobs were placed on this worker's own streams."""
    runner = WorkerRunner(tiny_engine, client, dataclasses.replace(settings, slots=1), model=MODEL)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    assert runner.ready.wait(10)
    try:
        # long enough to outlast the queueing below: steps no longer wait on Redis, so 200 tokens could end first
        busy = submit(client, job("busy", max_tokens=2000))
        while (first := busy.get_message(timeout=5)) is None or first["type"] != "message":
            pass  # the one slot is taken
        listener = client.pubsub()
        ids = [f"low-{i}" for i in range(50)] + ["critical"]
        listener.subscribe(*(keys.events_channel(MODEL, rid) for rid in ids))
        for _ in ids:
            assert listener.get_message(timeout=2)["type"] == "subscribe"
        for rid in ids:
            priority = "critical" if rid == "critical" else "low"
            message = job(rid, priority=priority, max_tokens=2)
            stream = keys.jobs_stream(MODEL, priority)
            if priority == "low" and low_on == "own":
                stream = keys.worker_jobs_stream(MODEL, runner.worker_id, priority)
            client.xadd(stream, {keys.JOB_FIELD: codec.encode_job(message)})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = listener.get_message(timeout=1)
            if got and got["type"] == "message":
                assert codec.decode_event(got["data"]).id == "critical"  # the first job after "busy" to start
                break
        else:
            raise AssertionError("no job started")
    finally:
        runner.stop_requested.set()
        thread.join(timeout=30)


def test_a_worker_restarted_under_its_own_id_takes_its_jobs_back_at_once(tiny_engine: Any, client: redis.Redis,
                                                                          settings: Settings) -> None:
    """Its predecessor died holding a job (pending for the same consumer name, lease 30 s): the new process
    resumes it at start, with a new owner epoch that fences the dead one off."""
    slow_lease = dataclasses.replace(settings, lease_s=30.0)
    WorkerRunner(tiny_engine, client, slow_lease, model=MODEL, worker_id="same").ensure_group()
    pubsub = submit(client, job("mine"))
    entry = client.xreadgroup(keys.JOBS_GROUP, "same", {keys.jobs_stream(MODEL): ">"}, count=1)[0][1][0][0]
    [grant] = take_ownership(client, keys.jobs_stream(MODEL), "same", MODEL, [("mine", entry.decode())], ttl_s=60)
    assert grant.epoch == 1  # the predecessor owned it, then died (kill -9)
    restarted = WorkerRunner(tiny_engine, client, slow_lease, model=MODEL, worker_id="same")
    started = time.monotonic()
    thread = threading.Thread(target=restarted.run, daemon=True)
    thread.start()
    try:
        events = collect(pubsub, timeout=20)
        assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 5
        assert [e.seq for e in events] == list(range(len(events)))
        assert time.monotonic() - started < 15  # not the 30 s lease
        assert client.get(keys.owner_key(MODEL, "mine")) == b"done"
    finally:
        restarted.stop_requested.set()
        thread.join(timeout=10)
