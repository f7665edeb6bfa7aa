"""echo + logprobs through the worker loop on a real Redis: the prompt's logprobs come once, before the first
token, on every choice; a takeover after they were sent neither repeats nor loses them."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from shared import codec, keys
from shared.messages import (
    ChoiceEndEvent,
    DoneEvent,
    GenerateJob,
    Sampling,
    TokenEvent,
    TokenLogprob,
)
from shared.settings import Settings
from tests.support.job_events import collect, submit
from worker.serve.runner import WorkerRunner

pytestmark = pytest.mark.integration
MODEL = "tiny"


def job(rid: str, **kw: Any) -> GenerateJob:
    now = time.time()
    return GenerateJob(id=rid, model=MODEL, created=now, deadline=now + 30, prompt_token_ids=[5, 6, 7, 8],
                       ignore_eos=True, sampling=Sampling(temperature=0.0), echo=True, **kw)


def serve(engine: Any, client: redis.Redis, settings: Settings, pubsub: Any) -> list[Any]:
    """Run a worker until the request's terminal event; its events."""
    runner = WorkerRunner(engine, client, settings, model=MODEL)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        return collect(pubsub)
    finally:
        runner.stop_requested.set()
        thread.join(timeout=10)


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_echo_with_logprobs_sends_the_prompt_scores_first_on_every_choice(tiny_engine: Any, client: redis.Redis,
                                                                         settings: Settings, max_tokens: int) -> None:
    events = serve(tiny_engine, client, settings, submit(client, job(f"echo-{max_tokens}", n=2, logprobs=2,
                                                                      max_tokens=max_tokens)))
    assert [e.seq for e in events] == list(range(len(events)))
    echoes = [e for e in events if isinstance(e, TokenEvent) and e.echo]
    assert [e.index for e in echoes] == [0, 1] and events[:2] == echoes
    for echo in echoes:
        assert echo.token_ids == [5, 6, 7, 8] and echo.logprobs is not None and len(echo.logprobs) == 4
        assert echo.logprobs[0].logprob is None and echo.logprobs[0].top == []
        assert all(isinstance(e.logprob, float) and e.logprob <= 0 and len(e.top) == 2 for e in echo.logprobs[1:])
        assert echo.text == "".join(e.token for e in echo.logprobs)
    generated = [e for e in events if isinstance(e, TokenEvent) and not e.echo]
    assert len(generated) == 2 * max_tokens and all(e.logprobs and len(e.logprobs[0].top) == 2 for e in generated)
    assert [e.finish_reason for e in events if isinstance(e, ChoiceEndEvent)] == ["length", "length"]
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.prompt_tokens == 4
    assert events[-1].usage.completion_tokens == 2 * max_tokens


def test_a_takeover_after_the_echo_went_out_neither_repeats_nor_loses_it(tiny_engine: Any, client: redis.Redis,
                                                                         settings: Settings) -> None:
    """The first holder died after publishing the echo (with its logprobs): the new owner continues after it."""
    stream = keys.jobs_stream(MODEL)
    WorkerRunner(tiny_engine, client, settings, model=MODEL, worker_id="dead").ensure_group()
    pubsub = submit(client, job("taken", logprobs=1, max_tokens=3))
    assert client.xreadgroup(keys.JOBS_GROUP, "dead", {stream: ">"}, count=1)  # then it is never heard of again
    sent = TokenEvent(id="taken", seq=0, text="x", token_ids=[5, 6, 7, 8], echo=True,
                      logprobs=[TokenLogprob(token_id=t, token="x", logprob=None if t == 5 else -1.0)
                                for t in (5, 6, 7, 8)])
    client.xadd(keys.journal_stream(MODEL, "taken"), {"seq": "0", "event": codec.encode_event(sent)})
    events = serve(tiny_engine, client, settings, pubsub)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # seq 0 is the journaled echo
    assert not [e for e in events if isinstance(e, TokenEvent) and e.echo]
    assert len([e for e in events if isinstance(e, TokenEvent)]) == 3 and isinstance(events[-1], DoneEvent)
    journal = [codec.decode_event(f[b"event"]) for _, f in client.xrange(keys.journal_stream(MODEL, "taken"))]
    assert sum(isinstance(e, TokenEvent) and e.echo for e in journal) == 1
