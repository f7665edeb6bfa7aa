"""End to end with the unmodified official `openai` client: HTTP -> gateway -> Redis -> SmolLM2 workers -> SSE."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
TOLERANCE = 0.05


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture()
def aclient(cluster: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion" and reply.model == MODEL
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0 and reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completion_token_ids_greedy_logprobs_match_llama_cpp(client: openai.OpenAI, smollm2_reference: dict,
                                                              smollm2_gguf_path: Any) -> None:
    from worker.engine.formats.gguf_file import read_metadata
    from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf

    tokenizer = tokenizer_from_gguf(read_metadata(smollm2_gguf_path))
    case = smollm2_reference["greedy"][0]
    reply = client.completions.create(model=MODEL, prompt=case["prompt_ids"], max_tokens=48, temperature=0,
                                      logprobs=5, extra_body={"ignore_eos": True})
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == 48
    checked = 0
    for step, top5 in enumerate(case["top5_per_step"]):
        if top5[0][1] - top5[1][1] <= TOLERANCE:
            break  # free-running greedy may follow either side of a near-tie from here on
        ref_id = case["greedy_ids"][step]
        assert lp.tokens[step] == tokenizer.token_bytes(ref_id).decode("utf-8", errors="replace"), f"step {step}"
        assert abs(lp.token_logprobs[step] - top5[0][2]) <= TOLERANCE, f"step {step}"
        ours = lp.top_logprobs[step]
        for token_id, _logit, ref_logprob in top5:
            text = tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")
            assert text in ours and abs(ours[text] - ref_logprob) <= TOLERANCE, f"step {step} token {token_id}"
        checked += 1
    assert checked >= 5


def test_n_and_stop(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, n=2,
                                      temperature=0.9, seed=3)
    assert sorted(c.index for c in reply.choices) == [0, 1]
    stopped = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=40,
                                        temperature=0, stop=["\n"], extra_body={"ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop" and "\n" not in stopped.choices[0].text
    assert stopped.choices[0].text.strip().startswith("Paris")


def test_embeddings_from_a_generative_model_are_a_400_naming_the_model(client: openai.OpenAI) -> None:
    """SmolLM2 is no embedding model: without LLMFLEET_CAUSAL_EMBEDDINGS its workers refuse, in OpenAI's shape."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=MODEL, input=["hello world", "Redis is an in-memory store"])
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == ("invalid_request_error", "model")
    assert f"'{MODEL}' is a generative model" in error["message"]
    assert "LLMFLEET_CAUSAL_EMBEDDINGS=1" in error["message"]


def test_models_and_errors(client: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=CHAT)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=CHAT, temperature=7)
    assert bad.value.status_code == 400 and bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt="hi " * 5000, max_tokens=4000)
    assert too_long.value.body["code"] == "context_length_exceeded"


def test_disconnect_frees_the_worker_slot(cluster: Any) -> None:
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 1500, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", cluster.base_url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        received = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert received
        busy_by = time.monotonic() + 10  # the next heartbeat reports the slot in use
        while sum(int(e.get(b"load", 0)) for e in cluster.worker_entries()) < 1:
            assert time.monotonic() < busy_by, "no worker reported the stream's slot as busy"
            time.sleep(0.1)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if sum(int(e.get(b"load", 0)) for e in cluster.worker_entries()) == 0:
            return
        time.sleep(0.25)
    raise AssertionError("the worker still holds the disconnected request's slot")


def test_two_workers_take_jobs_and_queue_full_gives_429(cluster: Any, aclient: openai.AsyncOpenAI) -> None:
    before = {e[b"started"]: int(e.get(b"served", 0)) for e in cluster.worker_entries()}

    async def one(i: int) -> str:
        try:
            await aclient.completions.create(model=MODEL, prompt=f"Story number {i}:", max_tokens=32,
                                             temperature=0, extra_body={"ignore_eos": True})
            return "ok"
        except openai.RateLimitError as exc:
            assert exc.response.headers.get("retry-after")
            return "429"

    async def burst() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(40)))

    outcomes = asyncio.run(burst())
    assert "429" in outcomes and "ok" in outcomes, outcomes  # 2 workers x 4 slots + a queue of 4 cannot hold 40
    time.sleep(1.2)  # a heartbeat publishes the counters
    after = {e[b"started"]: int(e.get(b"served", 0)) for e in cluster.worker_entries()}
    assert len(after) == 2 and all(after[k] > before.get(k, 0) for k in after), (before, after)
