"""A seeded request's choices are the same bits whatever the scheduler does around it (real SmolLM2, float16 pool):
alone, again through a prefix-cache hit, and inside a crowd of other requests prefilled and decoded in its steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, SequenceStep

pytestmark = pytest.mark.slow

PROMPT = ("You are a careful assistant. Summarise in two sentences why lighthouses were built on rocky coasts, "
          "how their keepers lived through the winter storms, and what replaced them once ships carried radio "
          "and satellite navigation, then suggest a name for a lighthouse museum.")
SEEDED = SamplingParams(temperature=0.9, seed=7)


def _request(rid: str, prompt: list[int], sampling: SamplingParams, n: int = 1, max_tokens: int = 16) -> GenerationRequest:
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling, ignore_eos=True)
    return GenerationRequest(rid, prompt, params, n=n)


def _run(sched: Scheduler) -> dict[str, dict[int, list[int]]]:
    """Step until idle: request -> choice -> token ids."""
    tokens: dict[str, dict[int, list[int]]] = {}
    while sched.has_work:
        for event in sched.step():
            if isinstance(event, SequenceStep):
                tokens.setdefault(event.request_id, {}).setdefault(event.index, []).append(event.output.token_id)
    return tokens


def test_seeded_choices_alone_on_a_cache_hit_and_in_a_crowd(smollm2_engine: Any) -> None:
    prompt = smollm2_engine.encode_prompt(PROMPT)
    sched = Scheduler(smollm2_engine, SchedulerConfig())
    sched.add(_request("cold", prompt, SEEDED, n=2))
    cold = _run(sched)["cold"]
    assert len(cold) == 2 and cold[0] != cold[1]  # two distinct samples
    sched.add(_request("hit", prompt, SEEDED, n=2))
    assert _run(sched)["hit"] == cold
    assert sched.blocks.stats.hits == 1 and sched.blocks.stats.tokens_hit >= 32
    crowd = Scheduler(smollm2_engine, SchedulerConfig(max_prefill_tokens=48, prefix_cache=False))
    rng = np.random.default_rng(3)
    for i in range(10):
        other = [int(t) for t in rng.integers(3, smollm2_engine.model.config.vocab_size, int(rng.integers(1, 90)))]
        sampling = SamplingParams(temperature=float(rng.uniform(0, 1.2)), seed=i)
        crowd.add(_request(f"other{i}", other, sampling, max_tokens=int(rng.integers(4, 24))))
        if i == 4:
            crowd.add(_request("crowded", prompt, SEEDED, n=2))
    assert _run(crowd)["crowded"] == cold
