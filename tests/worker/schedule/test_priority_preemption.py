"""Priorities hold while work runs: a waiting request that outranks running ones preempts them (recompute),
starts at once, and the preempted ones resume later with exactly the tokens they would have made."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, Priority, SequenceStep

SAMPLINGS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_p=0.95, seed=7)]


def _prompt(engine: Any, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, engine.model.config.vocab_size, n)]


def _request(rid: str, prompt: list[int], max_tokens: int, priority: Priority, index: int = 0) -> GenerationRequest:
    params = GenerationParams(max_tokens=max_tokens, sampling=SAMPLINGS[index % 2], ignore_eos=True)
    return GenerationRequest(rid, prompt, params, priority=priority)


def _tokens(events: list[Any], into: dict[str, list[int]]) -> set[str]:
    """Add each step's tokens to `into`; returns the requests that got a token this step."""
    got = set()
    for event in events:
        if isinstance(event, SequenceStep):
            into.setdefault(event.request_id, []).append(event.output.token_id)
            got.add(event.request_id)
    return got


def _alone(engine: Any, request: GenerationRequest) -> list[int]:
    sched = Scheduler(engine, SchedulerConfig(prefix_cache=False))
    sched.add(request)
    out: dict[str, list[int]] = {}
    while sched.has_work:
        _tokens(sched.step(), out)
    return out[request.request_id]


def _busy(engine: Any, config: SchedulerConfig, lows: list[GenerationRequest]) -> tuple[Scheduler, dict]:
    """A scheduler with every low request running (a few tokens in)."""
    sched = Scheduler(engine, config)
    for request in lows:
        sched.add(request)
    out: dict[str, list[int]] = {}
    for _ in range(6):
        _tokens(sched.step(), out)
    assert set(out) == {r.request_id for r in lows}  # all of them decode
    return sched, out


@pytest.mark.parametrize("bound", ["slots", "kv"])
def test_a_higher_priority_request_preempts_and_starts_at_once_and_nothing_is_lost(tiny_engine: Any,
                                                                                  bound: str) -> None:
    lows = [_request(f"low{i}", _prompt(tiny_engine, 40, i), 60, Priority.LOW, i) for i in range(4)]
    config = SchedulerConfig(max_sequences=4, prefix_cache=False)
    if bound == "kv":  # slots to spare; 13 blocks of 32 tokens: the four low ones' 2 blocks each, one free per
        # decode, and 1 more (the urgent prompt needs 2)
        block_bytes = Scheduler(tiny_engine, config).kv_pool.block_bytes
        config = SchedulerConfig(max_sequences=8, prefix_cache=False,
                                 kv_budget_mib=13.5 * block_bytes / 2**20)
    sched, out = _busy(tiny_engine, config, lows)
    urgent = _request("urgent", _prompt(tiny_engine, 40, 99), 8, Priority.HIGH)
    sched.add(urgent)
    first = _tokens(sched.step(), out)
    assert "urgent" in out and first == {"urgent"}  # its prefill went alone: it sampled in the very next step
    assert sched.stats.preemptions >= 1
    while sched.has_work:
        _tokens(sched.step(), out)
    assert out["urgent"] == _alone(tiny_engine, urgent)
    for request in lows:  # preempted, recomputed, resumed: the same tokens as undisturbed
        assert out[request.request_id] == _alone(tiny_engine, request), request.request_id
    assert sched.blocks.num_used_blocks == 0


def test_equal_priority_waits_for_a_slot(tiny_engine: Any) -> None:
    running = [_request(f"n{i}", _prompt(tiny_engine, 20, i), 30, Priority.NORMAL, i) for i in range(2)]
    sched, out = _busy(tiny_engine, SchedulerConfig(max_sequences=2, prefix_cache=False), running)
    sched.add(_request("later", _prompt(tiny_engine, 20, 50), 4, Priority.NORMAL))
    for _ in range(5):
        _tokens(sched.step(), out)
    assert sched.stats.preemptions == 0 and "later" not in out


def test_outranked_decodes_sit_out_only_the_prefill(tiny_engine: Any) -> None:
    """With a free slot, no preemption is needed: the low decodes skip the urgent prefill's step, then go on."""
    lows = [_request(f"low{i}", _prompt(tiny_engine, 20, i), 40, Priority.LOW, i) for i in range(3)]
    sched, out = _busy(tiny_engine, SchedulerConfig(max_sequences=4, prefix_cache=False), lows)
    sched.add(_request("urgent", _prompt(tiny_engine, 30, 77), 5, Priority.HIGH))
    assert _tokens(sched.step(), out) == {"urgent"}
    assert _tokens(sched.step(), out) == {"urgent", "low0", "low1", "low2"}  # together again
    assert sched.stats.preemptions == 0
    while sched.has_work:
        _tokens(sched.step(), out)
    for request in lows:
        assert out[request.request_id] == _alone(tiny_engine, request)


@pytest.mark.integration
def test_a_full_worker_takes_a_job_that_outranks_its_work_and_runs_it_first(tiny_engine: Any, client: Any,
                                                                           settings: Any) -> None:
    """The worker's one slot runs a low job: a high job is still read (it can preempt) and ends first; the
    low one then finishes with every token."""
    import dataclasses
    import threading
    import time

    from shared.messages import DoneEvent, GenerateJob, Sampling, TokenEvent
    from tests.support.job_events import collect, submit
    from worker.serve.runner import WorkerRunner

    runner = WorkerRunner(tiny_engine, client, dataclasses.replace(settings, slots=1), model="tiny")
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    assert runner.ready.wait(10)
    try:
        now = time.time()

        def job(rid: str, priority: str, max_tokens: int) -> GenerateJob:
            return GenerateJob(id=rid, model="tiny", created=now, deadline=now + 120, prompt_token_ids=[5, 6, 7],
                               max_tokens=max_tokens, ignore_eos=True, priority=priority,
                               sampling=Sampling(temperature=0.8, seed=3))

        low = submit(client, job("low", "low", 2000))
        while (first := low.get_message(timeout=5)) is None or first["type"] != "message":
            pass  # the low job holds the slot
        urgent = collect(submit(client, job("urgent", "high", 4)))
        assert isinstance(urgent[-1], DoneEvent)
        rest = collect(low, timeout=120)
        assert isinstance(rest[-1], DoneEvent) and rest[-1].timing is not None
        assert rest[-1].timing.total_s > urgent[-1].timing.total_s  # the low one was still running
        assert 1 + sum(isinstance(e, TokenEvent) for e in rest) == 2000  # nothing lost
        assert runner.scheduler.stats.preemptions >= 1
    finally:
        runner.stop_requested.set()
        thread.join(timeout=30)


def test_a_running_step_stops_for_an_arrival_that_outranks_it_and_goes_on_after(tiny_engine: Any) -> None:
    lows = [_request(f"low{i}", _prompt(tiny_engine, 40, i), 30, Priority.LOW, i) for i in range(3)]
    sched, out = _busy(tiny_engine, SchedulerConfig(max_sequences=8, prefix_cache=False), lows)
    lengths = {seq.seq_id: sched.blocks.num_tokens(seq.seq_id) for seq in sched.admission.active}
    asked: list[int] = []

    def arrival_mid_step(rank: int) -> bool:  # the second question finds a job above the step's floor
        asked.append(rank)
        return len(asked) >= 2

    assert not _tokens(sched.step(arrival_mid_step), out)  # stopped: no token, no event
    assert asked == [int(Priority.LOW)] * 2 and sched.stats.interrupted_steps == 1
    held = {s.seq_id: sched.blocks.num_tokens(s.seq_id) for s in sched.admission.active}
    assert all(held[i] > n for i, n in lengths.items()) and sched.held.seq_ids == set(lengths)  # held, KV kept
    urgent = _request("urgent", _prompt(tiny_engine, 40, 99), 8, Priority.HIGH)
    sched.add(urgent)
    assert _tokens(sched.step(lambda rank: rank < Priority.HIGH), out) == {"urgent"}  # alone, at once: its
    # prefill's floor is HIGH, so the same arrival does not stop it
    assert _tokens(sched.step(lambda rank: False), out) == {"low0", "low1", "low2"}  # the held step goes on
    assert not sched.held.seq_ids
    while sched.has_work:
        _tokens(sched.step(lambda rank: False), out)
    assert out["urgent"] == _alone(tiny_engine, urgent)
    for request in lows:  # the stopped step went on from where it stopped: the same tokens as undisturbed
        assert out[request.request_id] == _alone(tiny_engine, request), request.request_id
    assert sched.blocks.num_used_blocks == 0


def test_a_held_step_drops_a_sequence_preempted_meanwhile(tiny_engine: Any) -> None:
    """Every slot is held: the arrival preempts a sequence of the held step, which goes on without it; the
    preempted one is recomputed later, and no token of anyone changes."""
    lows = [_request(f"low{i}", _prompt(tiny_engine, 40, i), 30, Priority.LOW, i) for i in range(3)]
    sched, out = _busy(tiny_engine, SchedulerConfig(max_sequences=3, prefix_cache=False), lows)
    assert not _tokens(sched.step(lambda rank: True), out)  # stopped before its second layer: held
    assert len(sched.held.seq_ids) == 3
    sched.add(_request("urgent", _prompt(tiny_engine, 40, 99), 8, Priority.HIGH))
    assert _tokens(sched.step(lambda rank: False), out) == {"urgent"} and sched.stats.preemptions == 1
    went_on = _tokens(sched.step(lambda rank: False), out)
    assert len(went_on) == 2 and "urgent" not in went_on  # the held step, less the preempted sequence
    while sched.has_work:
        _tokens(sched.step(lambda rank: False), out)
    for request in lows:
        assert out[request.request_id] == _alone(tiny_engine, request), request.request_id
    assert sched.blocks.num_used_blocks == 0


def test_an_interrupted_step_changes_no_token(tiny_engine: Any) -> None:
    lows = [_request(f"low{i}", _prompt(tiny_engine, 40, i), 20, Priority.LOW, i) for i in range(3)]
    config = SchedulerConfig(max_sequences=8, prefix_cache=False)
    sched, out = _busy(tiny_engine, config, lows)
    rng = np.random.default_rng(3)  # each question stops the step with probability 0.2
    stops = 0
    while sched.has_work:
        before = sched.stats.interrupted_steps
        _tokens(sched.step(lambda rank: bool(rng.random() < 0.2)), out)
        stops += sched.stats.interrupted_steps - before
    assert stops > 0
    for request in lows:
        assert out[request.request_id] == _alone(tiny_engine, request), request.request_id
    assert sched.blocks.num_used_blocks == 0
