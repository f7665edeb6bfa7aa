"""Prompt logprobs (echo + logprobs): the scheduler's scores equal a teacher-forced forward's log-softmax."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shared.errors import InvalidRequest
from shared.messages import GenerateJob
from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.forward_batch import BatchEntry
from worker.engine.kv.pool import KVPool
from worker.schedule import prompt_scoring
from worker.schedule.prompt_scoring import PromptScored, PromptScorer
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, RequestDone, SequenceStep
from worker.serve import jobs

PROMPT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, counting each of the one "
          "hundred and twelve steps, and lit the great lamp that warned the fishing boats away from the rocks.")


def teacher_forced(engine: Any, ids: list[int]) -> np.ndarray:
    """log-softmax (L, V) of every position's logits, the whole prompt in one forward on a fresh pool."""
    pool = KVPool(engine.model.config, 64, 16, enable_prefix_caching=False)
    pool.ensure(0, len(ids))
    logits = np.asarray(engine.model.forward([BatchEntry(0, np.array(ids), 0, "all")], pool)[0], np.float64)
    peak = logits.max(axis=1, keepdims=True)
    return logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True))


def request(rid: str, ids: list[int], max_tokens: int, top: int | None, n: int = 1) -> GenerationRequest:
    params = GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    return GenerationRequest(rid, ids, params, n=n, prompt_logprobs=top, cache_prompt=top is None)


def run(sched: Scheduler) -> list[Any]:
    """Every event until the scheduler is idle."""
    events: list[Any] = []
    while sched.has_work:
        events.extend(sched.step())
    return events


def test_prompt_logprobs_equal_a_teacher_forced_forward_across_chunks(smollm2_engine: Any) -> None:
    """A prompt longer than the prefill chunk, after the same prompt filled the prefix cache: every position is
    scored (no cache hit skips one), equal to one whole forward's log-softmax, top-3 included; n = 2."""
    ids = smollm2_engine.encode_prompt(PROMPT)
    assert len(ids) > 24
    sched = Scheduler(smollm2_engine, SchedulerConfig(max_prefill_tokens=8, max_batch_tokens=64))
    sched.add(request("warm", ids, 2, None))
    plain = [e for e in run(sched) if isinstance(e, SequenceStep)]
    sched.add(request("scored", ids, 2, 3, n=2))
    events = run(sched)
    scored = [e for e in events if isinstance(e, PromptScored)]
    assert len(scored) == 1 and events.index(scored[0]) < min(
        i for i, e in enumerate(events) if isinstance(e, SequenceStep))
    scores = scored[0].scores
    assert [s.token_id for s in scores] == ids and scored[0].n == 2
    assert scores[0].logprob is None and scores[0].top == []
    reference = teacher_forced(smollm2_engine, ids)  # row p predicts token p + 1
    expected = [reference[p - 1, ids[p]] for p in range(1, len(ids))]
    np.testing.assert_allclose([s.logprob for s in scores[1:]], expected, atol=2e-3)
    for p in range(1, len(ids)):
        best = np.argsort(-reference[p - 1], kind="stable")[:3]
        assert [t for t, _ in scores[p].top] == [int(t) for t in best]
        np.testing.assert_allclose([lp for _, lp in scores[p].top], reference[p - 1, best], atol=2e-3)
    # scoring changes nothing else: the same greedy tokens, on both choices
    tokens = {i: [e.output.token_id for e in events if isinstance(e, SequenceStep) and e.index == i] for i in (0, 1)}
    assert tokens[0] == tokens[1] == [e.output.token_id for e in plain]
    done = [e for e in events if isinstance(e, RequestDone)][0]
    assert done.cached_tokens == 0 and not done.unsampled


def test_max_tokens_zero_scores_the_prompt_and_ends_every_choice_with_length(smollm2_engine: Any) -> None:
    ids = smollm2_engine.encode_prompt("Hello there, general")
    sched = Scheduler(smollm2_engine, SchedulerConfig(max_prefill_tokens=4))
    sched.add(request("zero", ids, 0, 1, n=2))
    events = run(sched)
    assert not [e for e in events if isinstance(e, SequenceStep)]
    assert isinstance(events[0], PromptScored) and len(events[0].scores) == len(ids)
    done = events[-1]
    assert isinstance(done, RequestDone) and done.unsampled
    assert done.finish_reasons == ["length", "length"] and done.completion_tokens == 0
    assert sched.stats.active == 0 and not sched.has_work


def test_a_one_token_prompt_has_just_the_null_first_entry(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(request("one", [5], 1, 2))
    scored = [e for e in run(sched) if isinstance(e, PromptScored)]
    assert [(s.token_id, s.logprob, s.top) for s in scored[0].scores] == [(5, None, [])]


def test_a_prefill_redone_after_preemption_writes_the_same_positions() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 50)).astype(np.float32)  # rows 0..5 predict tokens 1..6
    prompt = [int(t) for t in rng.integers(0, 50, 7)]
    scorer = PromptScorer(prompt, 2)
    scorer.add(0, logits[:3])
    assert not scorer.complete
    scorer.add(0, logits[:4])  # the prefill restarted from position 0 after a preemption
    scorer.add(4, np.vstack([logits[4:], rng.normal(size=(2, 50)).astype(np.float32)]))  # rows past the prompt
    assert scorer.complete
    scores = scorer.event("r", 1).scores
    log_softmax = logits - np.log(np.exp(logits.astype(np.float64)).sum(axis=1, keepdims=True))
    np.testing.assert_allclose([s.logprob for s in scores[1:]], log_softmax[np.arange(6), prompt[1:]], rtol=1e-6)
    assert [[t for t, _ in s.top] for s in scores[1:]] == np.argsort(-logits, axis=1)[:, :2].tolist()


def test_echo_logprobs_prompts_over_the_limit_are_refused_naming_logprobs(tiny_engine: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "MAX_SCORED_PROMPT_TOKENS", 4)
    job = GenerateJob(id="j", model="m", created=0.0, deadline=1.0, prompt_token_ids=[5, 6, 7, 8, 9], max_tokens=1,
                      echo=True, logprobs=1)
    with pytest.raises(InvalidRequest) as caught:
        jobs.generation_request(tiny_engine, job)
    assert caught.value.param == "logprobs" and "at most 4" in str(caught.value)
    plain = jobs.generation_request(tiny_engine, GenerateJob(id="k", model="m", created=0.0, deadline=1.0,
                                                             prompt_token_ids=[5, 6, 7, 8, 9], echo=True))
    assert plain.prompt_logprobs is None and plain.cache_prompt  # echo alone needs no scoring
    scored = jobs.generation_request(tiny_engine, GenerateJob(id="l", model="m", created=0.0, deadline=1.0,
                                                              prompt_token_ids=[5, 6], echo=True, logprobs=0))
    assert scored.prompt_logprobs == 0 and not scored.cache_prompt
    assert prompt_scoring.MAX_SCORED_PROMPT_TOKENS >= 1024


def test_scores_survive_a_preemption_in_the_middle_of_the_prompt(tiny_engine: Any,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Decodes growing in a small KV pool preempt the scored request during its chunked prefill; its prefill is
    redone and the scores are still sent once, equal to a teacher-forced forward."""
    rng = np.random.default_rng(7)
    vocab = tiny_engine.model.config.vocab_size
    budget_mib = 1024 * tiny_engine.model.config.kv_bytes_per_token / 2**20  # a pool of 1,024 tokens
    sched = Scheduler(tiny_engine, SchedulerConfig(max_sequences=4, kv_budget_mib=budget_mib, max_prefill_tokens=4,
                                                   max_batch_tokens=40))
    for i in range(2):  # 20 blocks of the 64 each once prefilled; each needs a block more every 16 steps
        sched.add(request(f"d{i}", [int(t) for t in rng.integers(3, vocab, 319)], 250, None))
    decoding: set[str] = set()
    while len(decoding) < 2:
        decoding |= {e.request_id for e in sched.step() if isinstance(e, SequenceStep)}
    scored_ids = [int(t) for t in rng.integers(3, vocab, 300)]
    sched.add(request("s", scored_ids, 3, 2, n=2))
    with caplog.at_level("INFO", logger="worker.schedule.admission"):
        events = run(sched)
    assert any("preempted request s " in r.getMessage() for r in caplog.records)
    scored = [e for e in events if isinstance(e, PromptScored)]
    assert len(scored) == 1
    reference = teacher_forced(tiny_engine, scored_ids)
    np.testing.assert_allclose([s.logprob for s in scored[0].scores[1:]],
                               [reference[p - 1, scored_ids[p]] for p in range(1, len(scored_ids))], atol=1e-3)
    steps = [e for e in events if isinstance(e, SequenceStep) and e.request_id == "s"]
    assert len(steps) == 6 and events.index(scored[0]) < events.index(steps[0])
    assert sched.blocks.num_used_blocks == 0
