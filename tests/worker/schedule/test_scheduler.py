"""Continuous batching: batching, chunking, preemption, prefix reuse and cancellation never change outputs."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from shared.errors import QueueFull
from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.forward_batch import BatchEntry
from worker.engine.kv.pool import KVPool
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, Priority, RequestDone, SequenceStep

GREEDY = SamplingParams(temperature=0.0)


def _prompt(engine: Any, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, engine.model.config.vocab_size, n)]


def _request(rid: str, prompt: list[int], max_tokens: int = 12, **kw: Any) -> GenerationRequest:
    sampling = kw.pop("sampling", GREEDY)
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling, ignore_eos=True)
    return GenerationRequest(rid, prompt, params, **kw)


def run_all(sched: Scheduler, max_steps: int = 10_000, on_step: Any = None) -> dict[str, dict[int, list[int]]]:
    """Step until idle; return request -> choice -> token ids."""
    tokens: dict[str, dict[int, list[int]]] = {}
    for _ in range(max_steps):
        if not sched.has_work:
            return tokens
        for event in sched.step():
            if isinstance(event, SequenceStep):
                tokens.setdefault(event.request_id, {}).setdefault(event.index, []).append(event.output.token_id)
        if on_step:
            on_step(sched)
    raise AssertionError("scheduler did not go idle")


def alone(engine: Any, prompt: list[int], max_tokens: int = 12) -> list[int]:
    sched = Scheduler(engine, SchedulerConfig(prefix_cache=False))
    sched.add(_request("solo", prompt, max_tokens))
    return run_all(sched)["solo"][0]


def test_batched_equals_alone(tiny_engine: Any) -> None:
    prompts = [_prompt(tiny_engine, n, i) for i, n in enumerate([3, 17, 40, 5, 64, 9, 30, 1])]
    sched = Scheduler(tiny_engine, SchedulerConfig(max_prefill_tokens=16, prefix_cache=False))
    for i, p in enumerate(prompts):
        sched.add(_request(f"r{i}", p))
    together = run_all(sched)
    for i, p in enumerate(prompts):
        assert together[f"r{i}"][0] == alone(tiny_engine, p), f"prompt {i}"


def test_long_prompt_prefills_in_chunks_beside_decodes(tiny_engine: Any) -> None:
    long_prompt = _prompt(tiny_engine, 1000, 42)
    sched = Scheduler(tiny_engine, SchedulerConfig(max_prefill_tokens=128, max_batch_tokens=160, prefix_cache=False))
    sched.add(_request("short", _prompt(tiny_engine, 4, 1), max_tokens=20))
    sched.step()  # short is now decoding
    sched.add(_request("long", long_prompt, max_tokens=4))
    short_tokens_during_prefill = long_tokens = 0
    for _ in range(8):  # 1000 tokens at 128 per step take 8 steps; the 8th samples long's first token
        events = sched.step()
        short_tokens_during_prefill += sum(1 for e in events if isinstance(e, SequenceStep) and e.request_id == "short")
        long_tokens += sum(1 for e in events if isinstance(e, SequenceStep) and e.request_id == "long")
    assert short_tokens_during_prefill == 8  # decode never paused for the prefill
    assert long_tokens == 1
    rest = run_all(sched)
    assert len(rest["long"][0]) == 3
    # chunked logits equal one-piece logits (the 1,000-token prompt)
    model = tiny_engine.model
    pool = KVPool(model.config, 160, 16, enable_prefix_caching=False)
    pool.ensure(0, 1000)
    pool.ensure(1, 1000)
    whole = model.forward([BatchEntry(0, np.array(long_prompt), 0)], pool)[0]
    for start in range(0, 1000, 128):
        chunked = model.forward([BatchEntry(1, np.array(long_prompt[start : start + 128]), start)], pool)[0]
    np.testing.assert_allclose(chunked, whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_kv_pool_never_overflows_and_preemption_keeps_outputs(tiny_engine: Any, prefix_cache: bool) -> None:
    per_token = tiny_engine.model.config.kv_bytes_per_token
    budget_mib = 1024 * per_token / 2**20  # a pool of 1,024 tokens
    prompts = [_prompt(tiny_engine, 200, 100 + i) for i in range(4)]
    expected = [alone(tiny_engine, p, max_tokens=120) for p in prompts]
    # all four at once would need 4 x 320 tokens: someone must be preempted and resumed
    sched = Scheduler(tiny_engine, SchedulerConfig(max_sequences=4, kv_budget_mib=budget_mib, prefix_cache=prefix_cache))
    for i, p in enumerate(prompts):
        sched.add(_request(f"r{i}", p, max_tokens=120))
    peaks = []
    got = run_all(sched, on_step=lambda s: peaks.append(s.blocks.num_used_blocks))
    assert sched.stats.preemptions > 0
    assert max(peaks) <= sched.kv_pool.n_blocks
    for i in range(4):
        assert got[f"r{i}"][0] == expected[i], f"request {i} changed by preemption"
    assert sched.blocks.num_used_blocks == 0  # nothing leaked
    sched.blocks.check_invariants()


def test_prefix_cache_hit_gives_same_output(tiny_engine: Any) -> None:
    shared = _prompt(tiny_engine, 300, 7)
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("first", shared + [5, 6]))
    first = run_all(sched)["first"][0]
    assert sched.blocks.stats.hits == 0
    sched.add(_request("second", shared + [5, 6]))
    second = run_all(sched)["second"][0]
    size = sched.kv_pool.block_size
    assert sched.blocks.stats.hits == 1 and sched.blocks.stats.tokens_hit == (len(shared) + 1) // size * size
    assert first == second
    sched.add(_request("third", shared + [9], cache_prompt=False))
    run_all(sched)
    assert sched.blocks.stats.hits == 1  # cache_prompt=False neither reads nor writes
    assert sched.blocks.num_used_blocks == 0


def test_concurrent_requests_share_prefix_blocks(tiny_engine: Any) -> None:
    """A running request's full prompt blocks serve a later one with the same prefix while both run."""
    shared = _prompt(tiny_engine, 96, 8)
    expected = alone(tiny_engine, shared + [7], max_tokens=30)
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("a", shared + [5], max_tokens=30))
    sched.step()
    sched.add(_request("b", shared + [7], max_tokens=30))
    used_before = sched.blocks.num_used_blocks
    first = [e.output.token_id for e in sched.step() if isinstance(e, SequenceStep) and e.request_id == "b"]
    assert sched.blocks.num_used_blocks - used_before <= 2  # b reuses a's full blocks, holds only its own tail
    assert sched.blocks.stats.tokens_hit >= 96 - sched.kv_pool.block_size
    assert first + run_all(sched)["b"][0] == expected
    assert sched.blocks.num_used_blocks == 0


def test_n_choices_copy_on_write_keeps_each_choice_its_own(tiny_engine: Any) -> None:
    """n=3 greedy choices share the prompt's blocks (the last one partly full) and all equal the lone run."""
    prompt = _prompt(tiny_engine, 37, 12)  # 37 tokens: a partly filled last block at any block size > 1
    expected = alone(tiny_engine, prompt, max_tokens=20)
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("n3", prompt, max_tokens=20, n=3))
    got = run_all(sched)["n3"]
    assert got == {0: expected, 1: expected, 2: expected}
    assert sched.blocks.num_used_blocks == 0


def test_cancel_frees_slot_in_any_state(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig(max_sequences=1, prefix_cache=False))
    sched.add(_request("running", _prompt(tiny_engine, 5, 1), max_tokens=100))
    sched.add(_request("waiting", _prompt(tiny_engine, 5, 2), max_tokens=3))
    sched.step()
    assert sched.stats.active == 1 and sched.stats.queue_depth == 1
    done = sched.cancel("running")
    assert isinstance(done, RequestDone) and done.finish_reasons == ["cancelled"]
    assert sched.stats.active == 0 and sched.stats.kv_bytes == 0
    sched.step()
    assert sched.stats.active == 1  # the waiting one took the slot on the very next step
    assert sched.cancel("waiting") is not None and sched.cancel("waiting") is None
    assert not sched.has_work


def test_queue_full_refuses(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig(max_queue=2))
    sched.add(_request("a", [5, 6]))
    sched.add(_request("b", [5, 6]))
    with pytest.raises(QueueFull):
        sched.add(_request("c", [5, 6]))


def test_higher_priority_admitted_first(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig(max_sequences=1, prefix_cache=False))
    order = []
    for rid, prio in [("low", Priority.LOW), ("normal", Priority.NORMAL), ("crit", Priority.CRITICAL),
                      ("high", Priority.HIGH), ("normal2", Priority.NORMAL)]:
        sched.add(_request(rid, [5, 6, 7], max_tokens=2, priority=prio))
    while sched.has_work:
        for e in sched.step():
            if isinstance(e, RequestDone):
                order.append(e.request_id)
    assert order == ["crit", "high", "normal", "normal2", "low"]


def test_n_choices_share_one_prefill(tiny_engine: Any) -> None:
    prompt = _prompt(tiny_engine, 50, 3)
    sched = Scheduler(tiny_engine, SchedulerConfig(prefix_cache=False))
    sched.add(_request("multi", prompt, max_tokens=8, n=3, sampling=SamplingParams(temperature=50.0, seed=11)))
    got = run_all(sched)["multi"]
    assert sorted(got) == [0, 1, 2] and all(len(v) == 8 for v in got.values())
    assert sched.stats.prompt_tokens == 50  # prefilled once, not three times
    assert len({tuple(v) for v in got.values()}) > 1  # distinct seeds give distinct samples
    sched.add(_request("multi2", prompt, max_tokens=8, n=3, sampling=SamplingParams(temperature=50.0, seed=11)))
    assert run_all(sched)["multi2"] == got  # seeded: reproducible


def test_timings_and_stats(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig())
    sched.add(_request("t", [5, 6, 7], max_tokens=4))
    done = [e for _ in range(10) for e in sched.step() if isinstance(e, RequestDone)]
    assert len(done) == 1
    t = done[0].timings
    assert t.queue_s is not None and t.ttft_s is not None and t.decode_s is not None
    assert done[0].completion_tokens == 4 and done[0].prompt_tokens == 3
    assert sched.stats.requests_finished == 1 and sched.stats.generated_tokens == 4


def test_embeddings_run_in_the_scheduler_beside_decodes(tiny_engine: Any) -> None:
    """An embedding is a prefill-only request: chunked, batched with decodes, equal to the engine's own."""
    from worker.schedule.sequences import EmbeddingDone, EmbeddingRequest

    inputs = [_prompt(tiny_engine, 70, 21), _prompt(tiny_engine, 5, 22)]
    sched = Scheduler(tiny_engine, SchedulerConfig(max_prefill_tokens=16))
    sched.add(_request("gen", _prompt(tiny_engine, 4, 23), max_tokens=30))
    sched.step()
    sched.add_embedding(EmbeddingRequest("emb", inputs, pooling="mean"))
    decoded_while_embedding = 0
    done = None
    while done is None:
        events = sched.step()
        decoded_while_embedding += sum(1 for e in events if isinstance(e, SequenceStep))
        done = next((e for e in events if isinstance(e, EmbeddingDone)), None)
    assert decoded_while_embedding >= 4  # 70 tokens in 16-token chunks: the decode never paused
    assert done.prompt_tokens == 75 and len(done.embeddings) == 2
    for ids, vector in zip(inputs, done.embeddings):
        np.testing.assert_allclose(vector, tiny_engine.embed(ids), rtol=1e-4, atol=1e-5)
    run_all(sched)
    assert sched.blocks.num_used_blocks == 0  # no KV kept after an embedding


def test_slots_default_to_what_the_pool_holds(tiny_engine: Any) -> None:
    from worker.schedule.scheduler_config import AUTO_MAX_SLOTS, AUTO_TOKENS_PER_SLOT

    per_token = tiny_engine.model.config.kv_bytes_per_token
    small = Scheduler(tiny_engine, SchedulerConfig(kv_budget_mib=10 * AUTO_TOKENS_PER_SLOT * per_token / 2**20))
    assert 8 <= small.config.max_sequences <= 10
    assert Scheduler(tiny_engine, SchedulerConfig()).config.max_sequences == AUTO_MAX_SLOTS
    assert Scheduler(tiny_engine, SchedulerConfig(max_sequences=3)).config.max_sequences == 3


@pytest.mark.parametrize("max_sequences", [1, 3])
def test_speculative_drafts_never_change_greedy_output(tiny_engine: Any, max_sequences: int) -> None:
    """Prompt-lookup drafts are checked exactly: the tokens equal one-at-a-time decoding, fewer steps."""
    loop = _prompt(tiny_engine, 12, 31)
    prompts = [loop * 6, _prompt(tiny_engine, 40, 32), loop * 3 + [7]]  # repetitive prompts invite drafts
    plain = Scheduler(tiny_engine, SchedulerConfig(speculative_tokens=0, max_sequences=max_sequences))
    spec = Scheduler(tiny_engine, SchedulerConfig(speculative_tokens=5, max_sequences=max_sequences))
    for sched in (plain, spec):
        for i, p in enumerate(prompts):
            sched.add(_request(f"r{i}", p, max_tokens=60))
    assert run_all(spec) == run_all(plain)
    assert spec.stats.speculated_tokens > 0 and spec.stats.accepted_tokens > 0
    assert spec.stats.steps < plain.stats.steps
    assert spec.blocks.num_used_blocks == 0
    spec.blocks.check_invariants()


def test_speculation_respects_stop_strings_and_max_tokens(tiny_engine: Any) -> None:
    """A finish inside an accepted run of drafts ends the sequence there."""
    loop = _prompt(tiny_engine, 10, 33)
    for max_tokens in (1, 2, 7):
        outs = []
        for k in (0, 6):
            sched = Scheduler(tiny_engine, SchedulerConfig(speculative_tokens=k))
            sched.add(_request("r", loop * 5, max_tokens=max_tokens))
            outs.append(run_all(sched)["r"][0])
        assert outs[0] == outs[1] and len(outs[1]) == max_tokens


def test_sampling_values_are_checked_by_the_engine_and_named(tiny_engine: Any) -> None:
    """The wire carries types only; an out-of-range value is the engine's to refuse, naming the field."""
    import msgspec

    from shared.errors import InvalidRequest
    from shared.messages import GenerateJob, Sampling
    from worker.serve.jobs import generation_request

    job = GenerateJob(id="j", model="m", created=1.0, deadline=2.0, prompt_token_ids=[5, 6], max_tokens=4,
                      sampling=Sampling(top_p=0.0))
    with pytest.raises(InvalidRequest, match="top_p"):
        generation_request(tiny_engine, job)
    ok = generation_request(tiny_engine, msgspec.structs.replace(job, sampling=Sampling(top_p=0.5, seed=3)))
    assert ok.params.sampling.top_p == 0.5 and ok.params.sampling.seed == 3


def _events_by_choice(sched: Scheduler) -> dict[int, list[tuple[int, str]]]:
    """Step until idle; choice -> [(token id, text released)]."""
    out: dict[int, list[tuple[int, str]]] = {}
    while sched.has_work:
        for e in sched.step():
            if isinstance(e, SequenceStep):
                out.setdefault(e.index, []).append((e.output.token_id, e.output.text))
    return out


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, top_p=0.95, seed=7),
                                      SamplingParams(temperature=1.2, repetition_penalty=1.2, seed=11)])
def test_a_resumed_request_continues_exactly(tiny_engine: Any, sampling: SamplingParams) -> None:
    """Replaying the tokens another worker sent, then continuing, gives the undisturbed tokens and text."""
    prompt = _prompt(tiny_engine, 30, 41)
    params = GenerationParams(max_tokens=24, sampling=sampling, stop=("ab",), ignore_eos=True)
    full = _events_by_choice(_with(tiny_engine, GenerationRequest("r", prompt, params, n=2)))
    for cut in (1, 9, 23):
        resumed_from = [[t for t, _ in full[i][:cut]] for i in (0, 1)]
        sched = _with(tiny_engine, GenerationRequest("r", prompt, params, n=2, resume_tokens=resumed_from))
        rest = _events_by_choice(sched)
        for i in (0, 1):
            assert [t for t, _ in rest.get(i, [])] == [t for t, _ in full[i][cut:]], f"choice {i} cut {cut}"
            assert "".join(x for _, x in rest.get(i, [])) == "".join(x for _, x in full[i][cut:])
    done = _with(tiny_engine, GenerationRequest("r", prompt, params, n=2, resume_tokens=[[5], [6]],
                                                resume_ended={0, 1})).step()
    assert isinstance(done[0], RequestDone) and done[0].completion_tokens == 2  # only the terminal was missing


def _with(engine: Any, request: GenerationRequest) -> Scheduler:
    sched = Scheduler(engine, SchedulerConfig())
    sched.add(request)
    return sched


def test_tokens_left_counts_what_unfinished_requests_may_still_generate(tiny_engine: Any) -> None:
    sched = Scheduler(tiny_engine, SchedulerConfig(max_sequences=4))
    sched.add(_request("a", _prompt(tiny_engine, 5, 1), max_tokens=6, n=2))
    sched.add(_request("b", _prompt(tiny_engine, 5, 2), max_tokens=4))
    sched.step()  # prefill (each choice of a samples its first token)
    assert sched.stats.tokens_left == 2 * 5 + 3
    run_all(sched)
    assert sched.stats.tokens_left == 0


def test_committing_ahead_runs_only_when_asked_and_changes_no_output(tiny_engine: Any) -> None:
    """A scheduler asked to commit KV pages ahead starts a thread for its pool (kv/commit_ahead.py); one built without
    settings starts none; either gives the same tokens."""
    def committers() -> int:
        return sum(thread.name == "kv-commit-ahead" for thread in threading.enumerate())

    prompt = _prompt(tiny_engine, 70, 11)
    before = committers()
    plain = Scheduler(tiny_engine, SchedulerConfig())
    assert committers() == before
    plain.add(_request("plain", prompt))
    ahead = Scheduler(tiny_engine, SchedulerConfig(kv_commit_ahead_mib=1))
    assert committers() == before + 1
    ahead.add(_request("ahead", prompt))
    assert run_all(ahead)["ahead"] == run_all(plain)["plain"]
    assert ahead.blocks.high_water >= 3  # 70 prompt + 12 new tokens in blocks of 32
