"""Streaming: the exact SSE bytes of chat and completion streams, and errors before and after the start."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from gateway.replies import serving
from shared.errors import ContextLengthExceeded, InternalError
from shared.messages import TokenLogprob, TopLogprob
from tests.support.sse import split_id, split_ids

pytestmark = pytest.mark.anyio

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture(autouse=True)
def fixed_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make response ids predictable."""
    monkeypatch.setattr(serving, "new_request_id", lambda: "req-0123")


def _created(body: bytes) -> int:
    match = re.search(rb'"created":(\d+)', body)
    assert match
    return int(match.group(1))


async def test_chat_stream_golden_bytes_with_usage(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream_options": {"include_usage": True}}))
    job = await worker.take()
    assert job.stream and job.messages is not None and job.messages[0].content == "hi"
    await worker.answer(job, ["Hel", "lo"])
    response = await task
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    created = _created(response.content)
    head = f'"id":"chatcmpl-0123","object":"chat.completion.chunk","created":{created},"model":"smollm2","system_fingerprint":"fp_llmfleet"'
    expected = (
        f'id: 0\ndata: {{{head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}],"usage":null}}\n\n'
        f'id: 1\ndata: {{{head},"choices":[{{"index":0,"delta":{{"content":"Hel"}},"logprobs":null,"finish_reason":null}}],"usage":null}}\n\n'
        f'id: 2\ndata: {{{head},"choices":[{{"index":0,"delta":{{"content":"lo"}},"logprobs":null,"finish_reason":null}}],"usage":null}}\n\n'
        f'id: 3\ndata: {{{head},"choices":[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"stop"}}],"usage":null}}\n\n'
        f'id: 4\ndata: {{{head},"choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{{"cached_tokens":0}}}}}}\n\n'
        "data: [DONE]\n\n"
    )
    assert response.content.decode() == expected


async def test_chat_stream_golden_bytes_without_usage(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    await worker.answer(job, ["Hi"], reason='length')
    response = await task
    created = _created(response.content)
    head = f'"id":"chatcmpl-0123","object":"chat.completion.chunk","created":{created},"model":"smollm2","system_fingerprint":"fp_llmfleet"'
    assert response.content.decode() == (
        f'id: 0\ndata: {{{head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}}\n\n'
        f'id: 1\ndata: {{{head},"choices":[{{"index":0,"delta":{{"content":"Hi"}},"logprobs":null,"finish_reason":null}}]}}\n\n'
        f'id: 2\ndata: {{{head},"choices":[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"length"}}]}}\n\n'
        "data: [DONE]\n\n"
    )


async def test_completion_stream_golden_bytes(client, worker) -> None:
    body = {"model": "smollm2", "prompt": "Once", "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}}
    task = asyncio.create_task(client.post("/v1/completions", json=body))
    job = await worker.take()
    assert (job.prompt, job.max_tokens, job.echo) == ("Once", 2, False)
    await worker.answer(job, [" upon", " a"], reason='length')
    response = await task
    created = _created(response.content)
    head = f'"id":"cmpl-0123","object":"text_completion","created":{created},"model":"smollm2","system_fingerprint":"fp_llmfleet"'
    assert response.content.decode() == (
        f'id: 0\ndata: {{{head},"choices":[{{"text":" upon","index":0,"logprobs":null,"finish_reason":null}}],"usage":null}}\n\n'
        f'id: 1\ndata: {{{head},"choices":[{{"text":" a","index":0,"logprobs":null,"finish_reason":null}}],"usage":null}}\n\n'
        f'id: 2\ndata: {{{head},"choices":[{{"text":"","index":0,"logprobs":null,"finish_reason":"length"}}],"usage":null}}\n\n'
        f'id: 3\ndata: {{{head},"choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{{"cached_tokens":0}}}}}}\n\n'
        "data: [DONE]\n\n"
    )


async def test_chat_stream_n2_logprobs_each_choice_starts_with_a_role_chunk(client, worker) -> None:
    body = {**CHAT, "n": 2, "logprobs": True, "top_logprobs": 1}
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    job = await worker.take()
    assert (job.n, job.logprobs) == (2, 1)
    lp = [TokenLogprob(token_id=5, token="A", logprob=-0.5, top=[TopLogprob(token_id=6, token="B", logprob=-1.0)])]
    await worker.token(job, "A", index=1, token_ids=[5], logprobs=lp)
    await worker.token(job, "A", index=0, token_ids=[5], logprobs=lp)
    await worker.end(job, index=1)
    await worker.end(job, index=0, reason='length')
    await worker.done(job)
    response = await task
    chunks = [json.loads(line[6:]) for line in split_ids(response.text)[1] if line.startswith("data: {")]
    per_choice = [[c["choices"][0] for c in chunks if c["choices"][0]["index"] == i] for i in (0, 1)]
    for choice in per_choice:
        assert choice[0]["delta"] == {"role": "assistant", "content": ""}
        assert choice[1]["delta"] == {"content": "A"}
        assert choice[1]["logprobs"] == {
            "content": [
                {"token": "A", "logprob": -0.5, "bytes": [65], "top_logprobs": [{"token": "B", "logprob": -1.0, "bytes": [66]}]}
            ]
        }
        assert choice[2]["delta"] == {}
    assert [c[2]["finish_reason"] for c in per_choice] == ["length", "stop"]
    assert response.text.endswith("data: [DONE]\n\n")


async def test_error_before_the_first_token_is_a_plain_http_error(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    error = ContextLengthExceeded("This model's maximum context length is 8192 tokens", param="messages")
    await worker.send(error.to_event(job.id, worker.next_seq(job.id)))
    response = await task
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": {
            "message": "This model's maximum context length is 8192 tokens",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


async def test_error_after_the_stream_began_is_a_final_sse_error_then_done(client, worker) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    job = await worker.take()
    await worker.token(job, "Hel")
    await worker.send(InternalError("the worker crashed").to_event(job.id, worker.next_seq(job.id)))
    response = await task
    assert response.status_code == 200
    lines = [split_id(frame)[1] for frame in response.content.split(b"\n\n")]
    assert lines[-3] == (
        b'data: {"error":{"message":"the worker crashed","type":"server_error","param":null,"code":null}}'
    )
    assert lines[-2] == b"data: [DONE]"
    assert b'"content":"Hel"' in lines[1]
