"""Batch invariance on the real models, bit for bit (np.array_equal), with the default float16 KV pool: a prompt's
last logits do not depend on how it was chunked, on what else is in its steps, on a prefix-cache hit, and a decode
step's logits equal a re-prefill of the prompt and the tokens generated so far (a failover's resume)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from worker.engine.errors import StepInterrupted
from worker.engine.forward_batch import BatchEntry
from worker.engine.kv.pool import KVPool
from worker.engine.model import Model
from worker.schedule.hybrid import chain_keys, restore_prefix

pytestmark = pytest.mark.slow

PROMPT = ("The lighthouse keeper counted the ships that passed each night, writing their names in a worn "
          "leather book, and on the coldest evening of the year a vessel with no name appeared on the horizon")
OTHER = "Write a haiku about spreadsheets."


@pytest.fixture(params=["smollm2_engine", "gemma3_engine", "llama3_twin_engine", "qwen3_twin_engine",
                        "qwen3moe_twin_engine", "gpt_oss_twin_engine", "qwen35_twin_engine",
                        "qwen35moe_twin_engine"])
def engine(request: pytest.FixtureRequest) -> Any:
    """Each real model in turn, and each new family's tiny twin (Q4_K_M where llama-quantize is built)."""
    return request.getfixturevalue(request.param)


def _pool(model: Model, caching: bool = False, budget: int = 32 << 20) -> KVPool:
    """A fresh float16 pool (the default dtype) of 16-token blocks (and a hybrid's state for up to 72 sequences)."""
    pool = model.new_pool(budget, block_size=16, enable_prefix_caching=caching, state_slots=72)  # a hybrid's: 65 run
    assert pool.dtype == np.float16
    return pool


def _prefill(model: Model, pool: KVPool, sid: int, tokens: list[int], chunk: int, done: int = 0) -> np.ndarray:
    """Prefill tokens[done:] of sequence sid alone, `chunk` tokens a step: the last logits (V,)."""
    logits = None
    while done < len(tokens):
        piece = tokens[done : done + chunk]
        pool.ensure(sid, done + len(piece))
        logits = model.forward([BatchEntry(sid, np.array(piece), done)], pool)[0]
        done += len(piece)
    return logits


def test_prompt_logits_do_not_depend_on_chunks_or_neighbours(engine: Any) -> None:
    """One chunk, chunks of 7, token by token, and in one step with other prompts and decode rows: same bits."""
    model: Model = engine.model
    tokens = engine.encode_prompt(PROMPT)
    assert len(tokens) > 32
    whole = _prefill(model, _pool(model), 0, tokens, len(tokens))
    assert np.array_equal(_prefill(model, _pool(model), 0, tokens, 7), whole)
    assert np.array_equal(_prefill(model, _pool(model), 0, tokens, 1), whole)
    pool = _pool(model)
    other = engine.encode_prompt(OTHER)
    _prefill(model, pool, 1, other, len(other))  # sequences already running: decode rows beside the prompt
    _prefill(model, pool, 2, tokens[:20], 20)
    pool.ensure(0, len(tokens))
    pool.extend(1, 1)
    pool.extend(2, 11)
    pool.ensure(3, 9)
    step = [BatchEntry(1, np.array([other[-1]]), len(other)), BatchEntry(2, np.array(tokens[20:31]), 20),
            BatchEntry(0, np.array(tokens), 0), BatchEntry(3, np.array(other[:9]), 0)]
    crowded = model.forward(step, pool)  # 1 + 11 + len(tokens) + 9 rows
    assert np.array_equal(crowded[2], whole)
    assert np.array_equal(crowded[1], _prefill(model, _pool(model), 0, tokens[:31], 31))


@pytest.mark.parametrize("others", [2, 64])
def test_a_decode_row_is_the_same_beside_2_to_64_other_prompts(engine: Any, others: int) -> None:
    """A decode row's logits alone and in one step with `others` prompts prefilling beside it (a routed FFN: its
    experts shared with other rows' or not), bit for bit."""
    model: Model = engine.model
    tokens = engine.encode_prompt(PROMPT)
    pools = [_pool(model, budget=256 << 20) for _ in range(2)]  # alone, crowded: a recurrent state runs each once
    for pool in pools:
        _prefill(model, pool, 0, tokens[:-1], len(tokens) - 1)
        pool.extend(0, 1)
    alone = model.forward([BatchEntry(0, np.array(tokens[-1:]), len(tokens) - 1)], pools[0])[0]  # (V,)
    pool = pools[1]
    step = [BatchEntry(0, np.array(tokens[-1:]), len(tokens) - 1)]
    for sid in range(1, others + 1):
        other = engine.encode_prompt(f"{OTHER} Number {sid}, in the style of poet {sid * 7}.")
        pool.ensure(sid, len(other))
        step.append(BatchEntry(sid, np.array(other), 0))
    assert np.array_equal(model.forward(step[::-1], pool)[-1], alone)


def _stopper(at: int) -> Callable[[], bool]:
    """An interrupt that answers True from its `at`-th question on (asked before each layer after the first)."""
    questions = itertools.count(1)
    return lambda: next(questions) >= at


@pytest.mark.parametrize("stop_at", [2, 10**6])  # before the second layer; before the output projection
def test_a_step_stopped_between_layers_goes_on_to_the_same_bits(engine: Any, stop_at: int) -> None:
    """A step stopped between layers (StepInterrupted) and resumed, with all its rows or without one, gives each row
    the logits of a step that ran through; a hybrid's step never stops (its recurrent state is rewritten in
    place)."""
    model: Model = engine.model
    tokens, other = engine.encode_prompt(PROMPT), engine.encode_prompt(OTHER)
    results = []
    for stopping in (False, True, True):
        pool = _pool(model)
        _prefill(model, pool, 1, other, len(other))
        pool.extend(1, 1)
        pool.ensure(0, len(tokens))
        step = [BatchEntry(1, np.array([other[-1]]), len(other)), BatchEntry(0, np.array(tokens), 0)]
        stop = _stopper(min(stop_at, model.config.n_layers) if stopping else 10**9)
        if not stopping or pool.states is not None:
            results.append(model.forward(step, pool, stop))
            continue
        with pytest.raises(StepInterrupted) as stopped:
            model.forward(step, pool, stop)
        suspended = stopped.value.suspended
        assert suspended is not None and suspended.layer == min(stop_at, model.config.n_layers)
        keep = {0, 1} if len(results) == 1 else {0}
        results.append(model.resume(suspended.keep(keep), pool))
    through, both, alone = results
    if len(alone) == 2:  # a hybrid's: every step ran through
        assert all(np.array_equal(r[i], through[i]) for r in results for i in range(2))
        return
    assert np.array_equal(both[0], through[0]) and np.array_equal(both[1], through[1])
    assert np.array_equal(alone[0], through[1])


def test_prefix_cache_hit_gives_the_fresh_prefill_logits(engine: Any) -> None:
    """A second sequence whose leading blocks come from the prefix cache ends with the same logits (a hybrid's
    starts from the recurrent state its first sequence left at a block boundary: a checkpoint)."""
    model: Model = engine.model
    tokens = engine.encode_prompt(PROMPT)
    pool = _pool(model, caching=True)
    pool.blocks.allocate(0, tokens)
    if pool.states is not None:  # the scheduler's hybrid prefill: stop at the last block boundary, keep the state
        edge = len(tokens) // 16 * 16
        _prefill(model, pool, 0, tokens[:edge], edge)
        pool.states.save(0, chain_keys(tokens, 16, None, edge // 16)[-1])
        fresh = _prefill(model, pool, 0, tokens, len(tokens), done=edge)
    else:
        fresh = _prefill(model, pool, 0, tokens, len(tokens))
    pool.blocks.commit(0, tokens)
    computed = pool.blocks.allocate(1, tokens)
    if pool.states is not None:
        computed = restore_prefix(pool.states, pool.blocks, 1, tokens, computed, None)
    assert computed >= 32  # at least two cached blocks
    assert np.array_equal(_prefill(model, pool, 1, tokens, len(tokens), done=computed), fresh)


def test_decode_logits_equal_a_re_prefill_of_prompt_and_tokens(engine: Any) -> None:
    """Greedy decode of 6 tokens one at a time; at every step the logits equal those of prompt + tokens so far
    prefilled in one go in a fresh pool (what a failover's re-prefill computes)."""
    model: Model = engine.model
    tokens = engine.encode_prompt(PROMPT)
    pool = _pool(model)
    logits = _prefill(model, pool, 0, tokens, len(tokens))
    generated: list[int] = []
    for _ in range(6):
        generated.append(int(np.argmax(logits)))
        start = len(tokens) + len(generated) - 1
        pool.extend(0, 1)
        logits = model.forward([BatchEntry(0, np.array(generated[-1:]), start)], pool)[0]
        resumed = tokens + generated
        assert np.array_equal(_prefill(model, _pool(model), 0, resumed, len(resumed)), logits)
