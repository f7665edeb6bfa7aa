"""Reasoning output on the gateway's surfaces (FakeRedis and a fake worker; SmolLM2 end to end is in
tests/integration/test_reasoning_api.py): chat's reasoning_content (collected and streamed), Anthropic's
thinking block, the request field and the server setting that turn it off, and tool calls parsed out of the
answer only."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import httpx
import pytest

from gateway.app import create_app
from shared.settings import Settings
from tests.gateway.anthropic.test_serving import sse_events
from tests.gateway.conftest import MODEL, sse_payloads

pytestmark = pytest.mark.anyio
ASK = [{"role": "user", "content": "Is 7 prime?"}]
PIECES = ["<th", "ink>\nSeven has no", " divisors but 1 and 7.\n</", "think>", "\n\nYes", ", 7 is prime."]
THOUGHT, ANSWER = "Seven has no divisors but 1 and 7.", "Yes, 7 is prime."


async def _chat(client: httpx.AsyncClient, worker: Any, pieces: list[str], **body: Any) -> httpx.Response:
    task = asyncio.create_task(client.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body}))
    job = await worker.take()
    await worker.answer(job, pieces)
    return await task


async def test_a_chat_reply_splits_off_its_thinking_block(client: httpx.AsyncClient, worker) -> None:
    message = (await _chat(client, worker, PIECES)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "reasoning": THOUGHT}


async def test_a_reply_without_a_thinking_block_has_no_reasoning_field(client: httpx.AsyncClient, worker) -> None:
    message = (await _chat(client, worker, ["Yes <think>", "</think>"])).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Yes <think></think>"}


async def test_reasoning_format_none_keeps_the_block_in_content(client: httpx.AsyncClient, worker) -> None:
    message = (await _chat(client, worker, PIECES, reasoning_format="none")).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "".join(PIECES)}
    response = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK,
                                                               "reasoning_format": "raw"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "reasoning_format"


async def test_a_streamed_reply_sends_reasoning_then_content(client: httpx.AsyncClient, worker) -> None:
    response = await _chat(client, worker, PIECES, stream=True)
    deltas = [p["choices"][0]["delta"] for p in sse_payloads(response.content)[:-1] if p["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == (THOUGHT, ANSWER)
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds == sorted(kinds, key=lambda kind: kind == "content")  # all reasoning, then all content


async def test_a_tool_call_is_parsed_from_the_answer_not_the_thinking(client: httpx.AsyncClient, worker) -> None:
    tool = {"type": "function", "function": {"name": "is_prime", "parameters": {"type": "object"}}}
    pieces = ['<think>Maybe <tool_call>{"name": "is_prime", "arguments": {}}</tool_call>?</think>',
              '<tool_call>{"name": "is_prime", "arguments": {"n": 7}}</tool_call>']
    choice = (await _chat(client, worker, pieces, tools=[tool])).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [{"n": 7}]
    assert choice["message"]["reasoning_content"].startswith("Maybe <tool_call>")


@pytest.fixture
async def plain_client(settings: Settings, server: fakeredis.FakeServer) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway started with LLMFLEET_REASONING_FORMAT=none."""
    app = create_app(dataclasses.replace(settings, reasoning_format="none"), redis=fakeredis.FakeAsyncRedis(server=server))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://g") as http:
        yield http


async def test_the_server_setting_turns_it_off_and_a_request_on(plain_client: httpx.AsyncClient, worker) -> None:
    message = (await _chat(plain_client, worker, PIECES)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "".join(PIECES)}
    message = (await _chat(plain_client, worker, PIECES, reasoning_format="deepseek")).json()["choices"][0]["message"]
    assert message["reasoning_content"] == THOUGHT


async def test_anthropic_returns_a_thinking_block(client: httpx.AsyncClient, worker) -> None:
    body = {"model": MODEL, "max_tokens": 32, "messages": ASK}
    task = asyncio.create_task(client.post("/v1/messages", json=body))
    job = await worker.take()
    await worker.answer(job, PIECES)
    content = (await task).json()["content"]
    assert content == [{"type": "thinking", "thinking": THOUGHT, "signature": ""}, {"type": "text", "text": ANSWER}]
    task = asyncio.create_task(client.post("/v1/messages", json={**body, "stream": True}))
    job = await worker.take()
    await worker.answer(job, PIECES)
    events = sse_events((await task).content)
    starts = [e["content_block"] for name, e in events if name == "content_block_start"]
    assert starts == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""}]
    deltas = [e["delta"] for name, e in events if name == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == THOUGHT
    assert "".join(d.get("text", "") for d in deltas) == ANSWER


@pytest.mark.parametrize(("body", "skips"), [({"stop": ["STOP"]}, True), ({}, False),
                                             ({"stop": ["STOP"], "reasoning_format": "none"}, False)])
async def test_the_job_says_whether_stop_strings_skip_the_thinking(client: httpx.AsyncClient, worker, body: dict,
                                                                     skips: bool) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body}))
    job = await worker.take()
    assert job.reasoning is skips  # the worker matches stop strings in the answer only (worker/engine/text/stopping.py)
    await worker.answer(job, PIECES)
    assert (await task).status_code == 200


async def test_a_reply_that_starts_inside_the_block(client: httpx.AsyncClient, make_worker) -> None:
    """Its workers' template opens the block in the prompt (registry `opens_thinking`): no `<think>` in the reply."""
    thinker = make_worker(worker_id="w-think")
    await thinker.register(opens_thinking=1)
    pieces = ["Seven has no", " divisors but 1 and 7.\n</", "think>", "\n\nYes", ", 7 is prime."]
    message = (await _chat(client, thinker, pieces)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "reasoning": THOUGHT}
    response = await _chat(client, thinker, pieces, stream=True)
    deltas = [p["choices"][0]["delta"] for p in sse_payloads(response.content)[:-1] if p["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER


@pytest.mark.parametrize(("body", "shaped"), [
    ({"response_format": {"type": "json_object"}}, True),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, True),
    ({"thinking_budget_tokens": 8, "max_tokens": 32}, True),
    ({"response_format": {"type": "json_object"}, "reasoning_format": "none"}, False)])
async def test_the_job_says_whether_its_constraint_skips_the_thinking(client: httpx.AsyncClient, worker,
                                                                      body: dict, shaped: bool) -> None:
    task = asyncio.create_task(client.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body}))
    job = await worker.take()
    assert job.reasoning is shaped  # the worker starts the constraint after </think> (worker/engine/text/thinking.py)
    assert job.thinking_budget == body.get("thinking_budget_tokens")
    await worker.answer(job, ["{}"])
    assert (await task).status_code == 200


async def test_each_api_switches_thinking_off_the_same_way(client: httpx.AsyncClient, worker) -> None:
    """chat_template_kwargs, Anthropic's thinking and Ollama's think all reach the template as enable_thinking (and
    a think level as reasoning_effort)."""
    requests = [("/v1/chat/completions", {"model": MODEL, "messages": ASK,
                                          "chat_template_kwargs": {"enable_thinking": False}}, False),
                ("/v1/messages", {"model": MODEL, "max_tokens": 32, "messages": ASK,
                                  "thinking": {"type": "disabled"}}, False),
                ("/api/chat", {"model": MODEL, "messages": ASK, "stream": False, "think": False}, False),
                ("/v1/messages", {"model": MODEL, "max_tokens": 32, "messages": ASK,
                                  "thinking": {"type": "enabled", "budget_tokens": 16}}, True),
                ("/api/chat", {"model": MODEL, "messages": ASK, "stream": False, "think": "high"}, True)]
    for path, body, enabled in requests:
        task = asyncio.create_task(client.post(path, json=body))
        job = await worker.take()
        level = {"reasoning_effort": "high"} if body.get("think") == "high" else {}
        assert job.template_kwargs == {"enable_thinking": enabled, **level}, path
        assert job.thinking_budget == (16 if path == "/v1/messages" and enabled else None)
        await worker.answer(job, ["Yes."])
        assert (await task).status_code == 200, (await task).text


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
    ("/v1/chat/completions", {"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"thinking_budget_tokens": 40, "max_tokens": 40}, "thinking_budget_tokens"),
    ("/v1/messages", {"max_tokens": 32, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ("/v1/messages", {"max_tokens": 32, "thinking": {"type": "enabled", "budget_tokens": 32}}, "thinking.budget_tokens"),
    ("/v1/messages", {"max_tokens": 32, "thinking": {"type": "sometimes"}}, "thinking.type")])
async def test_a_bad_thinking_switch_is_a_400(client: httpx.AsyncClient, path: str, body: dict, param: str) -> None:
    response = await client.post(path, json={"model": MODEL, "messages": ASK, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert param in (error.get("param") or error.get("message")), error


async def test_a_template_that_honours_the_switch_does_not_open_the_block(client: httpx.AsyncClient,
                                                                          make_worker) -> None:
    """enable_thinking=false: the gateway splits as the registry's opens_thinking_disabled says."""
    thinker = make_worker(worker_id="w-switch")
    await thinker.register(opens_thinking=1, opens_thinking_disabled=0)
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    message = (await _chat(client, thinker, ["Yes, 7 is prime."], **off)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER}
    message = (await _chat(client, thinker, ["Seven has no divisors but 1 and 7.</think>Yes, 7 is prime."])
               ).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "reasoning": THOUGHT}
