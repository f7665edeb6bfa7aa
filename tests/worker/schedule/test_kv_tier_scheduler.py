"""Two schedulers (two workers' pools) sharing one host tier (real SmolLM2, float16 pool): a seeded request repeats
byte for byte on the worker that found its prompt in the tier, a resumed request (a failover) reads the first
worker's prompt and generated blocks and continues with the same tokens, also when its blocks were warmed before the
claim (LoRA chains never go to the tier)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.engine.decode.generation import GenerationParams
from worker.engine.decode.sampling import SamplingParams
from worker.schedule.scheduler import Scheduler, SchedulerConfig
from worker.schedule.sequences import GenerationRequest, RequestDone, SequenceStep

pytestmark = pytest.mark.slow

SYSTEM = ("You are a meticulous assistant for a maritime museum. Answer questions about lighthouses, their keepers, "
          "the ships they guided and the storms they survived, citing the year when you know it. ") * 4
SEEDED = SamplingParams(temperature=0.9, seed=11)


def _worker(engine: Any, tier_dir: Path) -> Scheduler:
    return Scheduler(engine, SchedulerConfig(kv_budget_mib=64, kv_tier_mib=64, kv_tier_dir=str(tier_dir)))


def _run(sched: Scheduler, request: GenerationRequest) -> tuple[list[int], RequestDone]:
    sched.add(request)
    tokens: list[int] = []
    done = None
    while sched.has_work:
        for event in sched.step():
            if isinstance(event, SequenceStep):
                tokens.append(event.output.token_id)
            elif isinstance(event, RequestDone):
                done = event
    assert done is not None
    return tokens, done


def _request(rid: str, prompt: list[int], max_tokens: int = 80, **extra: Any) -> GenerationRequest:
    return GenerationRequest(rid, prompt, GenerationParams(max_tokens=max_tokens, sampling=SEEDED, ignore_eos=True),
                             **extra)


def test_a_seeded_request_repeats_on_another_worker_through_the_tier(smollm2_engine: Any, tmp_path: Path) -> None:
    prompt = smollm2_engine.encode_prompt(SYSTEM + "Which lighthouse is the oldest?")
    a, b = _worker(smollm2_engine, tmp_path), _worker(smollm2_engine, tmp_path)
    first, done_a = _run(a, _request("a", prompt))
    assert done_a.cached_tokens == 0 and a.tier is not None and a.tier.flush()
    again, done_b = _run(b, _request("b", prompt))
    assert again == first
    assert done_b.cached_tokens == len(prompt) - 1 and b.tier.stats.hits == 1  # with A's snapshot of the last block
    a.blocks.check_invariants()
    b.blocks.check_invariants()


def test_a_failover_reads_the_dead_workers_prompt_and_generated_blocks(smollm2_engine: Any, tmp_path: Path) -> None:
    prompt = smollm2_engine.encode_prompt(SYSTEM + "Tell me about a storm.")
    dead, heir = _worker(smollm2_engine, tmp_path), _worker(smollm2_engine, tmp_path)
    whole, _ = _run(dead, _request("x", prompt))
    assert dead.tier.flush()
    sent = whole[:70]  # what the dead worker had sent when it died
    rest, done = _run(heir, _request("x", prompt, resume_tokens=[sent]))
    assert sent + rest == whole
    assert heir.tier.stats.tokens_hit >= (len(prompt) + len(sent) - 1) // 32 * 32  # prompt and generated blocks


def test_a_failover_mid_stream_reads_the_last_blocks_snapshot(smollm2_engine: Any, tmp_path: Path) -> None:
    prompt = smollm2_engine.encode_prompt(SYSTEM + "Describe a lighthouse at night.")
    whole, _ = _run(Scheduler(smollm2_engine, SchedulerConfig(kv_budget_mib=64)), _request("x", prompt))
    dead, heir = _worker(smollm2_engine, tmp_path), _worker(smollm2_engine, tmp_path)
    dead.add(_request("x", prompt))
    sent: list[int] = []
    while len(sent) < 45:  # the worker dies here, mid-decode, with no step finished after it
        sent += [e.output.token_id for e in dead.step() if isinstance(e, SequenceStep)]
    assert dead.tier.flush()
    rest, _ = _run(heir, _request("x", prompt, resume_tokens=[sent]))
    assert sent + rest == whole
    position = len(prompt) + len(sent) - 1  # the tokens the heir needs before it runs the last one
    assert heir.tier.stats.tokens_hit == position  # whole blocks and the last one's snapshot: only the last token runs


def test_a_takeover_warmed_before_its_claim_reads_only_the_last_blocks_snapshot(smollm2_engine: Any,
                                                                                tmp_path: Path) -> None:
    from shared.messages import GenerateJob
    from worker.failover.resume import JournalState
    from worker.serve.intake import JobIntake

    prompt = smollm2_engine.encode_prompt(SYSTEM + "Which keeper stayed longest?")
    dead, heir = _worker(smollm2_engine, tmp_path), _worker(smollm2_engine, tmp_path)
    whole, _ = _run(dead, _request("x", prompt))
    assert dead.tier.flush()
    sent = whole[:61]
    job = GenerateJob(id="x", model="m", created=0.0, deadline=1e12, prompt_token_ids=prompt)
    intake = JobIntake(smollm2_engine, heir, None, None, None, default_max_tokens=0)  # type: ignore[arg-type]
    warmed = intake._warm_one(job, JournalState(next_seq=3, tokens={0: sent}))  # the suspect's job, before its claim
    assert warmed == (len(prompt) + len(sent) - 1) // 32 * 32
    lookups, hit = heir.tier.stats.lookups, heir.tier.stats.tokens_hit
    rest, _ = _run(heir, _request("x", prompt, resume_tokens=[sent]))  # the claim: its full blocks are in the pool
    assert sent + rest == whole
    assert heir.tier.stats.lookups == lookups and heir.tier.stats.tokens_hit - hit < 32  # the snapshot alone
    assert intake._warm_one(job, JournalState(tokens={0: sent}, ended={0})) == 0  # a choice that ended: nothing
    heir.blocks.check_invariants()
