"""A hybrid model (the tiny Qwen3.5 twin: gated delta-net layers with a recurrent state per sequence) under the
scheduler: batching, chunking, preemption, forked choices, resumed requests and prefixes restored from kept states
never change its outputs; it takes no drafts; its state slots come out of the KV budget."""

from __future__ import annotations

from typing import Any

import pytest

from tests.worker.schedule.test_scheduler import GREEDY, _events_by_choice, _prompt, _request, run_all
from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.engine.kv.recurrent_state import RecurrentStates
from worker.schedule.hybrid import aligned_chunk
from worker.schedule.pool_sizing import hybrid_split
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest

pytestmark = pytest.mark.slow
MIB = 1 << 20


@pytest.fixture
def engine(qwen35_twin_engine: Any) -> Any:
    """The tiny Qwen3.5 twin's engine."""
    return qwen35_twin_engine


def alone(engine: Any, prompt: list[int], max_tokens: int = 12) -> list[int]:
    sched = Scheduler(engine, SchedulerConfig())
    sched.add(_request("solo", prompt, max_tokens))
    return run_all(sched)["solo"][0]


def test_batched_and_chunked_equals_alone(engine: Any) -> None:
    prompts = [_prompt(engine, n, i) for i, n in enumerate([3, 17, 40, 5, 64, 1])]
    sched = Scheduler(engine, SchedulerConfig(max_prefill_tokens=16))
    for i, p in enumerate(prompts):
        sched.add(_request(f"r{i}", p))
    together = run_all(sched)
    for i, p in enumerate(prompts):
        assert together[f"r{i}"][0] == alone(engine, p), f"prompt {i}"
    assert sched.stats.speculated_tokens == 0  # a recurrent state cannot take a rejected draft back


def test_preemption_re_prefills_to_the_same_tokens(engine: Any) -> None:
    config = engine.model.config
    budget = 1024 * config.kv_bytes_per_token + 4 * RecurrentStates.bytes_per_sequence(config)  # KV for 1,024 tokens
    prompts = [_prompt(engine, 200, 100 + i) for i in range(4)]
    expected = [alone(engine, p, max_tokens=120) for p in prompts]
    sched = Scheduler(engine, SchedulerConfig(max_sequences=4, kv_budget_mib=budget / MIB))
    assert sched.kv_pool.capacity_tokens <= 1056  # 4 x 320 tokens do not fit: someone is preempted
    for i, p in enumerate(prompts):
        sched.add(_request(f"r{i}", p, max_tokens=120))
    got = run_all(sched)
    assert sched.stats.preemptions > 0
    for i in range(4):
        assert got[f"r{i}"][0] == expected[i], f"request {i} changed by preemption"
    assert sched.blocks.num_used_blocks == 0


def test_forked_choices_start_from_the_prompts_state(engine: Any) -> None:
    prompt = _prompt(engine, 37, 12)
    expected = alone(engine, prompt, max_tokens=20)
    sched = Scheduler(engine, SchedulerConfig())
    sched.add(_request("n3", prompt, max_tokens=20, n=3))
    assert run_all(sched)["n3"] == {0: expected, 1: expected, 2: expected}


def test_a_shared_prefix_starts_from_a_kept_state_to_the_same_tokens(engine: Any) -> None:
    """A prompt sharing a first one's leading blocks restores the state kept at the deepest shared block boundary
    (a checkpoint) and prefills only the rest: the same tokens as a cold run."""
    system = _prompt(engine, 300, 7)
    second = system + _prompt(engine, 40, 8)
    cold = alone(engine, second)
    sched = Scheduler(engine, SchedulerConfig(max_prefill_tokens=128))
    sched.add(_request("first", system + [5, 6]))
    run_all(sched)
    states = sched.kv_pool.states
    assert states.saved >= 3  # at 128 and 256 (chunk ends) and 288 (the prompt's last block boundary)
    sched.add(_request("second", second))
    assert run_all(sched)["second"][0] == cold
    assert states.restored == 1 and sched._groups == {}
    sched.add(_request("third", second, cache_prompt=False))
    assert run_all(sched)["third"][0] == cold and states.restored == 1  # cache_prompt=False neither reads nor keeps


@pytest.mark.parametrize("computed, chunk, total, expected", [
    (0, 100, 100, 96), (96, 4, 100, 4), (0, 512, 1000, 512), (0, 500, 1000, 480), (0, 10, 100, 10),
    (0, 96, 96, 96), (90, 10, 100, 6), (0, 20, 20, 20), (0, 40, 40, 32),
])
def test_a_hybrid_prefill_chunk_ends_on_a_block_edge(computed: int, chunk: int, total: int, expected: int) -> None:
    assert aligned_chunk(computed, chunk, total, 32) == expected


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, top_p=0.95, seed=7)])
def test_a_resumed_request_continues_exactly(engine: Any, sampling: SamplingParams) -> None:
    """A failover's resume (prompt and sent tokens prefilled from the first token) gives the undisturbed rest."""
    prompt = _prompt(engine, 30, 41)
    params = GenerationParams(max_tokens=24, sampling=sampling, ignore_eos=True)
    sched = Scheduler(engine, SchedulerConfig())
    sched.add(GenerationRequest("r", prompt, params, n=2))
    full = _events_by_choice(sched)
    for cut in (1, 9, 23):
        sched = Scheduler(engine, SchedulerConfig())
        sched.add(GenerationRequest("r", prompt, params, n=2,
                                    resume_tokens=[[t for t, _ in full[i][:cut]] for i in (0, 1)]))
        rest = _events_by_choice(sched)
        for i in (0, 1):
            assert [t for t, _ in rest.get(i, [])] == [t for t, _ in full[i][cut:]], f"choice {i} cut {cut}"


def test_state_slots_come_out_of_the_kv_budget(engine: Any) -> None:
    config = engine.model.config
    per_sequence = RecurrentStates.bytes_per_sequence(config)
    left, slots = hybrid_split(config, 64 * MIB, SchedulerConfig())
    states = RecurrentStates.total_bytes(config, slots)  # the slots and their checkpoints (a quarter as many)
    assert states == (slots + slots // 4) * per_sequence
    assert 1 <= slots <= 64 and states <= 32 * MIB and left == 64 * MIB - states
    sched = Scheduler(engine, SchedulerConfig(kv_budget_mib=64))
    assert sched.config.max_sequences == slots == sched.kv_pool.states.slots
    with pytest.raises(ValueError, match="recurrent state"):
        hybrid_split(config, 4 * per_sequence, SchedulerConfig(max_sequences=4))
