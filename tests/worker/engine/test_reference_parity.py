"""SmolLM2 against llama.cpp's reference logits, teacher-forced, as ../shared/fixtures/smollm2/README.md says.

Every path the scheduler takes through the KV pool is checked against the same numbers: one sequence alone,
all prompts in one batch, a prefix-cache hit, n>1 forks sharing blocks (copy-on-write), chunked prefill and
a preemption (blocks freed, the sequence re-prefilled from the cache) in the middle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from worker.engine.forward_batch import BatchEntry
from worker.engine.kv.pool import KVPool
from worker.engine.model import Model

pytestmark = pytest.mark.slow
LOGIT_TOLERANCE = 0.05
MARGIN_FOR_ARGMAX = 0.05


def check_step(logits: np.ndarray, top5: list[list[float]], greedy_id: int, where: str) -> float:
    """Assert one step against the reference; return the worst logit difference."""
    worst = 0.0
    for token_id, ref_logit, _ in top5:
        diff = abs(float(logits[int(token_id)]) - ref_logit)
        worst = max(worst, diff)
        assert diff <= LOGIT_TOLERANCE, f"{where}: token {token_id} logit {logits[int(token_id)]} vs {ref_logit}"
    if top5[0][1] - top5[1][1] > MARGIN_FOR_ARGMAX:
        assert int(np.argmax(logits)) == greedy_id, f"{where}: argmax {np.argmax(logits)} vs {greedy_id}"
    return worst


def _step(model: Model, pool: KVPool, seq_id: int, tokens: list[int]) -> np.ndarray:
    """Append tokens to a sequence that already has a table, and return the last logits."""
    start = pool.blocks.num_tokens(seq_id)
    pool.extend(seq_id, len(tokens))
    return model.forward([BatchEntry(seq_id, np.array(tokens), start)], pool)[0]


def test_all_prompts_all_steps_teacher_forced(smollm2_engine: Any, smollm2_reference: dict) -> None:
    model: Model = smollm2_engine.model
    pool = model.new_pool(64 << 20, enable_prefix_caching=False)
    worst = 0.0
    for sid, case in enumerate(smollm2_reference["greedy"]):
        assert len(case["greedy_ids"]) == 48
        pool.ensure(sid, len(case["prompt_ids"]))
        logits = model.forward([BatchEntry(sid, np.array(case["prompt_ids"]), 0)], pool)[0]
        for step, greedy_id in enumerate(case["greedy_ids"]):
            worst = max(worst, check_step(logits, case["top5_per_step"][step], greedy_id,
                                          f"{case['prompt']!r} step {step}"))
            logits = _step(model, pool, sid, [greedy_id])
        pool.blocks.free(sid)
    assert worst < LOGIT_TOLERANCE
    assert pool.blocks.num_used_blocks == 0


def test_parity_holds_inside_a_batch_of_others(smollm2_engine: Any, smollm2_reference: dict) -> None:
    """All 8 reference prompts decoded together, teacher-forced, in one batch per step."""
    model: Model = smollm2_engine.model
    cases = smollm2_reference["greedy"]
    pool = model.new_pool(64 << 20, block_size=16, enable_prefix_caching=False)
    for sid, case in enumerate(cases):
        pool.ensure(sid, len(case["prompt_ids"]))
    outs = model.forward([BatchEntry(sid, np.array(c["prompt_ids"]), 0) for sid, c in enumerate(cases)], pool)
    for step in range(48):
        for case, logits in zip(cases, outs):
            check_step(logits, case["top5_per_step"][step], case["greedy_ids"][step], f"{case['prompt']!r} step {step}")
        entries = []
        for sid, case in enumerate(cases):
            start = pool.blocks.num_tokens(sid)
            pool.extend(sid, 1)
            entries.append(BatchEntry(sid, np.array([case["greedy_ids"][step]]), start))
        outs = model.forward(entries, pool)


def test_parity_through_prefix_hits_forks_chunks_and_preemption(smollm2_engine: Any, smollm2_reference: dict) -> None:
    """The longest prompt, prefilled in chunks; three forks share its blocks; one is preempted and resumes."""
    model: Model = smollm2_engine.model
    case = max(smollm2_reference["greedy"], key=lambda c: len(c["prompt_ids"]))
    prompt, greedy, top5 = case["prompt_ids"], case["greedy_ids"], case["top5_per_step"]
    pool = model.new_pool(64 << 20, block_size=4)  # small blocks: many block boundaries, a partial last block
    assert pool.blocks.allocate(0, prompt) == 0
    for start in range(0, len(prompt), 7):  # chunked prefill
        chunk = prompt[start : start + 7]
        logits = model.forward([BatchEntry(0, np.array(chunk), start)], pool)[0]
    pool.blocks.commit(0, prompt)
    check_step(logits, top5[0], greedy[0], "chunked prefill")
    # a second request with the same prompt hits the cache and only runs what is not cached
    computed = pool.blocks.allocate(10, prompt)
    assert 0 < computed < len(prompt)
    hit = model.forward([BatchEntry(10, np.array(prompt[computed:]), computed)], pool)[0]
    check_step(hit, top5[0], greedy[0], "prefix hit")
    pool.blocks.free(10)
    # n>1: forks share the prompt's blocks; copy-on-write keeps each one's KV its own
    for child in (1, 2):
        pool.blocks.fork(0, child)
    history = list(prompt)
    for step in range(1, 24):
        token = greedy[step - 1]
        history.append(token)
        entries = []
        for sid in (0, 1, 2):
            start = pool.blocks.num_tokens(sid)
            pool.extend(sid, 1)
            entries.append(BatchEntry(sid, np.array([token]), start))
        for sid, logits in zip((0, 1, 2), model.forward(entries, pool)):
            check_step(logits, top5[step], greedy[step], f"fork {sid} step {step}")
        if step == 12:  # preempt sequence 2: free its blocks, then resume by re-prefilling from the cache
            pool.blocks.commit(2, history)
            pool.blocks.free(2)
            computed = pool.blocks.allocate(2, history)
            assert computed > len(prompt) // 2
            resumed = model.forward([BatchEntry(2, np.array(history[computed:]), computed)], pool)[0]
            check_step(resumed, top5[step], greedy[step], "resumed")
            pool.blocks.free(2)
            pool.blocks.fork(1, 2)
    for sid in (0, 1, 2):
        pool.blocks.free(sid)
    assert pool.blocks.num_used_blocks == 0


def test_greedy_generation_reproduces_reference_tokens(smollm2_engine: Any, smollm2_reference: dict) -> None:
    """Free-running greedy generation through the scheduler follows the reference until its first near-tie."""
    from worker.engine.decode.generation import GenerationParams
    from worker.engine.decode.sampling import SamplingParams
    from worker.local_generation import generate

    case = smollm2_reference["greedy"][0]
    params = GenerationParams(max_tokens=48, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    got = [out.token_id for out in generate(smollm2_engine, case["prompt_ids"], params)]
    for step, (mine, ref) in enumerate(zip(got, case["greedy_ids"])):
        top5 = case["top5_per_step"][step]
        if top5[0][1] - top5[1][1] <= MARGIN_FOR_ARGMAX:
            break
        assert mine == ref, f"step {step}"
