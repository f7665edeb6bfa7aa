"""Non-streaming requests: events are collected into complete OpenAI responses; models and readiness."""

from __future__ import annotations

import asyncio
import base64
import struct

import pytest

from shared.messages import EmbedJob, GenerateJob, TokenLogprob, TopLogprob

pytestmark = pytest.mark.anyio


async def test_chat_collects_tokens_of_every_choice(client, worker) -> None:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "n": 2,
        "max_tokens": 5,
        "temperature": 0.2,
        "seed": 7,
        "stop": "\n",
        "logit_bias": {"42": -100},
        "top_k": 20,
        "priority": "high",
    }
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    job = await worker.take()
    assert isinstance(job, GenerateJob)
    assert [(m.role, m.content) for m in job.messages or []] == [("system", "Be brief."), ("user", "hi")]
    assert (job.n, job.max_tokens, job.stop, job.priority, job.stream) == (2, 5, ["\n"], "high", False)
    assert (job.sampling.temperature, job.sampling.seed, job.sampling.top_k) == (0.2, 7, 20)
    assert job.sampling.logit_bias == {42: -100.0}
    assert job.deadline > job.created
    await worker.token(job, "Hi", index=1)
    await worker.token(job, "Hello", index=0)
    await worker.token(job, " there", index=1)
    await worker.end(job, index=0, reason='length')
    await worker.end(job, index=1)
    await worker.done(job, prompt_tokens=9, completion_tokens=3)
    response = await task
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-") and data["model"] == "smollm2"
    assert data["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "logprobs": None, "finish_reason": "length"},
        {"index": 1, "message": {"role": "assistant", "content": "Hi there"}, "logprobs": None, "finish_reason": "stop"},
    ]
    assert data["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
                             "prompt_tokens_details": {"cached_tokens": 0}}


async def test_gateway_fills_in_a_seed_when_none_is_given(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json={"model": "smollm2", "messages": [{"role": "user", "content": "x"}]}))
    job = await worker.take()
    assert isinstance(job, GenerateJob) and isinstance(job.sampling.seed, int)
    await worker.answer(job, ["ok"])
    assert (await task).status_code == 200


async def test_completion_with_echo_and_logprobs(client, worker) -> None:
    body = {"model": "smollm2", "prompt": "Hi", "echo": True, "logprobs": 1, "max_tokens": 1}
    task = asyncio.create_task(client.post("/v1/completions", json=body))
    job = await worker.take()
    assert isinstance(job, GenerateJob) and (job.prompt, job.echo, job.logprobs) == ("Hi", True, 1)
    prompt_lp = [TokenLogprob(token_id=1, token="Hi", logprob=None)]
    await worker.token(job, "Hi", token_ids=[1], logprobs=prompt_lp, echo=True)
    top = [TopLogprob(token_id=2, token="!", logprob=-0.1)]
    await worker.token(job, "!", token_ids=[2], logprobs=[TokenLogprob(token_id=2, token="!", logprob=-0.1, top=top)])
    await worker.end(job, reason='length')
    await worker.done(job, prompt_tokens=1, completion_tokens=1)
    data = (await task).json()
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert data["choices"] == [
        {
            "text": "Hi!",
            "index": 0,
            "logprobs": {
                "tokens": ["Hi", "!"],
                "token_logprobs": [None, -0.1],
                "top_logprobs": [None, {"!": -0.1}],
                "text_offset": [0, 2],
            },
            "finish_reason": "length",
        }
    ]


async def test_completion_with_several_prompts_numbers_choices_like_openai(client, worker) -> None:
    body = {"model": "smollm2", "prompt": [[1, 2], [3]], "n": 2}
    task = asyncio.create_task(client.post("/v1/completions", json=body))
    jobs = [await worker.take(), await worker.take()]
    assert [j.prompt_token_ids for j in jobs] == [[1, 2], [3]]  # type: ignore[union-attr]
    assert len({j.id for j in jobs}) == 2
    for p, job in enumerate(reversed(jobs)):
        for i in range(2):
            await worker.token(job, f"p{1 - p}c{i}", index=i)
            await worker.end(job, index=i)
        await worker.done(job, prompt_tokens=2, completion_tokens=2)
    data = (await task).json()
    assert [(c["index"], c["text"]) for c in data["choices"]] == [(0, "p0c0"), (1, "p0c1"), (2, "p1c0"), (3, "p1c1")]
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_embeddings(client, make_worker, encoding_format: str) -> None:
    embedder = make_worker(model="embedder", worker_id="e1")
    await embedder.register()
    body = {"model": "embedder", "input": ["a", "b"], "encoding_format": encoding_format}
    task = asyncio.create_task(client.post("/v1/embeddings", json=body))
    job = await embedder.take()
    assert isinstance(job, EmbedJob) and job.inputs == ["a", "b"]
    await embedder.done(job, prompt_tokens=2, completion_tokens=0, embeddings=[[0.5, -1.0], [0.25, 2.0]])
    data = (await task).json()
    assert data["object"] == "list" and data["model"] == "embedder"
    assert data["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    vectors = [d["embedding"] for d in data["data"]]
    if encoding_format == "base64":
        vectors = [list(struct.unpack("<2f", base64.b64decode(v))) for v in vectors]
    assert vectors == [[0.5, -1.0], [0.25, 2.0]]
    assert [(d["object"], d["index"]) for d in data["data"]] == [("embedding", 0), ("embedding", 1)]


async def test_models_lists_models_with_a_live_worker(client, worker, make_worker) -> None:
    await make_worker(model="org/other", worker_id="w2").register(started=1000)
    await make_worker(model="gone", worker_id="w3").register(state="draining")
    data = (await client.get("/v1/models")).json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["org/other", "smollm2"]
    assert data["data"][0] == {"id": "org/other", "object": "model", "created": 1000, "owned_by": "llmfleet",
                            "loaded": True}
    one = await client.get("/v1/models/org/other")
    assert one.status_code == 200 and one.json()["id"] == "org/other"
    missing = await client.get("/v1/models/gone")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_health_and_ready(client, make_worker) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    not_ready = await client.get("/ready")
    assert not_ready.status_code == 503
    assert not_ready.json() == {"ready": False, "redis": True, "workers": 0,
                                "waiting_for": ["a worker (none is registered)"]}
    await make_worker().register()
    assert (await client.get("/ready")).json() == {"ready": True, "redis": True, "workers": 1}
