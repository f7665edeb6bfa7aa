"""Batching an embedding-only encoder: whole inputs per forward within the token budget, no KV pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from worker.schedule.scheduler_config import SchedulerConfig
from worker.schedule.sequences import EmbeddingDone, EmbeddingRequest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm_engine(minilm_f16_path: Path):
    from worker.engine.engine import Engine

    return Engine.load(minilm_f16_path)


TEXTS = ["Hello world", "A man is playing a guitar.", "Redis is an in-memory store", "hi", "The quick brown fox"]


def run_all(scheduler) -> dict[str, EmbeddingDone]:
    """Step until idle; the EmbeddingDone events by request id."""
    done: dict[str, EmbeddingDone] = {}
    while scheduler.has_work:
        for event in scheduler.step():
            assert isinstance(event, EmbeddingDone)
            done[event.request_id] = event
    return done


def test_requests_share_forwards_within_the_token_budget(minilm_engine) -> None:
    from worker.schedule.encoder_scheduler import EncoderScheduler, new_scheduler

    scheduler = new_scheduler(minilm_engine, SchedulerConfig(max_batch_tokens=24))
    assert isinstance(scheduler, EncoderScheduler) and scheduler.kv_pool is None
    inputs = [minilm_engine.encode_prompt(t) for t in TEXTS]
    scheduler.add_embedding(EmbeddingRequest("a", inputs[:2]))
    scheduler.add_embedding(EmbeddingRequest("b", inputs[2:]))
    done = run_all(scheduler)
    assert scheduler.stats.steps == 2 and scheduler.stats.prompt_tokens == sum(map(len, inputs))
    vectors = done["a"].embeddings + done["b"].embeddings
    for ids, vector in zip(inputs, vectors):
        np.testing.assert_allclose(vector, minilm_engine.embed(ids), atol=2e-6)
    assert scheduler.stats.queue_depth == scheduler.stats.active == 0


def test_each_request_keeps_its_normalize_flag_in_a_shared_forward(minilm_engine) -> None:
    """Ollama's older /api/embeddings asks for raw pooled vectors; /v1/embeddings for unit ones: one forward."""
    from worker.schedule.encoder_scheduler import new_scheduler

    scheduler = new_scheduler(minilm_engine, SchedulerConfig())
    inputs = [minilm_engine.encode_prompt(t) for t in TEXTS[:2]]
    scheduler.add_embedding(EmbeddingRequest("raw", inputs, normalize=False))
    scheduler.add_embedding(EmbeddingRequest("unit", inputs))
    done = run_all(scheduler)
    assert scheduler.stats.steps == 1
    for ids, raw, unit in zip(inputs, done["raw"].embeddings, done["unit"].embeddings, strict=True):
        np.testing.assert_allclose(raw, minilm_engine.embed(ids, normalize=False), atol=1e-5)  # norm ~6
        assert abs(np.linalg.norm(raw) - 1.0) > 0.1 and abs(np.linalg.norm(unit) - 1.0) < 1e-5
        np.testing.assert_allclose(np.asarray(raw) / np.linalg.norm(raw), unit, atol=2e-6)


def test_cancel_and_refusals(minilm_engine) -> None:
    from shared.errors import InvalidRequest
    from shared.messages import GenerateJob
    from worker.engine.errors import ContextLengthError
    from worker.schedule.encoder_scheduler import new_scheduler
    from worker.serve.jobs import generation_request

    scheduler = new_scheduler(minilm_engine, SchedulerConfig())
    scheduler.add_embedding(EmbeddingRequest("gone", [minilm_engine.encode_prompt("bye")]))
    assert scheduler.cancel("gone") is None and not scheduler.has_work
    with pytest.raises(ContextLengthError, match="maximum context length is 512"):
        scheduler.add_embedding(EmbeddingRequest("long", [[101] * 513]))
    job = GenerateJob(id="c", model="all-minilm-l6-v2", created=0.0, deadline=1e12, prompt="hi", max_tokens=4)
    with pytest.raises(InvalidRequest, match="embedding model"):
        generation_request(minilm_engine, job)
