"""SmolLM2 against llama.cpp's reference logits, teacher-forced, as ../shared/fixtures/smollm2/README.md says."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from worker.engine.model import BatchEntry, Model

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


def test_all_prompts_all_steps_teacher_forced(smollm2_engine: Any, smollm2_reference: dict) -> None:
    model: Model = smollm2_engine.model
    worst = 0.0
    for case in smollm2_reference["greedy"]:
        assert len(case["greedy_ids"]) == 48
        cache = model.new_cache()
        logits = model.forward([BatchEntry(np.array(case["prompt_ids"]), cache)])[0]
        for step, greedy_id in enumerate(case["greedy_ids"]):
            worst = max(worst, check_step(logits, case["top5_per_step"][step], greedy_id,
                                          f"{case['prompt']!r} step {step}"))
            logits = model.forward([BatchEntry(np.array([greedy_id]), cache)])[0]
    assert worst < LOGIT_TOLERANCE


def test_parity_holds_inside_a_batch_of_others(smollm2_engine: Any, smollm2_reference: dict) -> None:
    """All 8 reference prompts decoded together, teacher-forced, in one batch per step."""
    model: Model = smollm2_engine.model
    cases = smollm2_reference["greedy"]
    caches = [model.new_cache() for _ in cases]
    outs = model.forward([BatchEntry(np.array(c["prompt_ids"]), cache) for c, cache in zip(cases, caches)])
    for step in range(48):
        for case, logits in zip(cases, outs):
            check_step(logits, case["top5_per_step"][step], case["greedy_ids"][step], f"{case['prompt']!r} step {step}")
        outs = model.forward([BatchEntry(np.array([c["greedy_ids"][step]]), cache) for c, cache in zip(cases, caches)])


def test_greedy_generation_reproduces_reference_tokens(smollm2_engine: Any, smollm2_reference: dict) -> None:
    """Free-running greedy generation (not teacher-forced) follows the reference until its first near-tie."""
    from worker.engine.sampling import SamplingParams
    from worker.engine.sequence import GenerationParams

    case = smollm2_reference["greedy"][0]
    params = GenerationParams(max_tokens=48, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    got = [out.token_id for out in smollm2_engine.generate(case["prompt_ids"], params)]
    for step, (mine, ref) in enumerate(zip(got, case["greedy_ids"])):
        top5 = case["top5_per_step"][step]
        if top5[0][1] - top5[1][1] <= MARGIN_FOR_ARGMAX:
            break
        assert mine == ref, f"step {step}"
