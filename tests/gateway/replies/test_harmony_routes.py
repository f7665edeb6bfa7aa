"""gpt-oss's harmony replies on every API (FakeRedis and a fake worker that registers `harmony` and answers with
harmony text, as the engine detokenizes it): the analysis channel is each API's reasoning, the final channel its
content, a commentary message to functions.X its tool call; collected and streamed, never a marker in the text.
Requests say their reasoning effort, and send earlier reasoning back, on every API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.gateway.anthropic.test_serving import sse_events
from tests.gateway.conftest import MODEL, sse_payloads

pytestmark = pytest.mark.anyio
ASK = [{"role": "user", "content": "Weather in Paris?"}]
THOUGHT, ANSWER = "The user asks about Paris. I should call get_weather.", "It is sunny in Paris."
PIECES = ["<|channel|>", "analysis", "<|message|>", "The user asks about Paris.", " I should call get_weather.",
          "<|end|>", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "It is sunny", " in Paris."]
CALL = ["<|channel|>analysis<|message|>", THOUGHT, "<|end|><|start|>assistant<|channel|>commentary",
        " to=functions.get_weather", " <|constrain|>json<|message|>", '{"city":', ' "Paris"}']
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MARKERS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "to=functions")


@pytest.fixture
async def gpt_oss(make_worker: Any) -> Any:
    """A fake worker whose template writes harmony (registry `harmony` 1)."""
    fake = make_worker(worker_id="w-gpt-oss")
    await fake.register(harmony=1)
    return fake


async def _served(client: httpx.AsyncClient, worker: Any, path: str, body: dict[str, Any],
                  pieces: list[str]) -> tuple[Any, httpx.Response]:
    task = asyncio.create_task(client.post(path, json={"model": MODEL, **body}))
    job = await worker.take()
    await worker.answer(job, pieces)
    return job, await task


def _no_markers(texts: list[str]) -> None:
    assert not any(marker in text for text in texts for marker in MARKERS), texts


async def test_chat_splits_the_channels(client: httpx.AsyncClient, gpt_oss: Any) -> None:
    _, response = await _served(client, gpt_oss, "/v1/chat/completions", {"messages": ASK}, PIECES)
    message = response.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "reasoning": THOUGHT}
    _, response = await _served(client, gpt_oss, "/v1/chat/completions", {"messages": ASK, "stream": True}, PIECES)
    deltas = [p["choices"][0]["delta"] for p in sse_payloads(response.content)[:-1] if p["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER
    _no_markers([d.get("content") or "" for d in deltas] + [d.get("reasoning_content", "") for d in deltas])


async def test_reasoning_format_none_keeps_the_analysis_message_as_llama_server_does(client: httpx.AsyncClient,
                                                                                     gpt_oss: Any) -> None:
    body = {"messages": ASK, "reasoning_format": "none"}
    _, response = await _served(client, gpt_oss, "/v1/chat/completions", body, PIECES)
    message = response.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": f"<|channel|>analysis<|message|>{THOUGHT}<|end|>{ANSWER}"}


async def test_chat_tool_call_round_trip(client: httpx.AsyncClient, gpt_oss: Any) -> None:
    _, response = await _served(client, gpt_oss, "/v1/chat/completions", {"messages": ASK, "tools": [TOOL]}, CALL)
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == THOUGHT
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    history = [*ASK, {**choice["message"]}, {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}]
    job, response = await _served(client, gpt_oss, "/v1/chat/completions", {"messages": history, "tools": [TOOL]},
                                  PIECES)
    assert job.messages[1].reasoning == THOUGHT  # sent back: the harmony template renders it before the call
    assert job.messages[1].tool_calls[0].name == "get_weather" and job.messages[2].content == "sunny, 21 C"
    assert response.json()["choices"][0]["message"]["content"] == ANSWER
    _, response = await _served(client, gpt_oss, "/v1/chat/completions",
                                {"messages": ASK, "tools": [TOOL], "stream": True}, CALL)
    payloads = sse_payloads(response.content)[:-1]
    deltas = [p["choices"][0]["delta"] for p in payloads if p["choices"]]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    assert [p["choices"][0]["finish_reason"] for p in payloads if p["choices"]][-1] == "tool_calls"
    _no_markers([d.get("content") or "" for d in deltas])


async def test_anthropic_gets_thinking_text_and_tool_use(client: httpx.AsyncClient, gpt_oss: Any) -> None:
    body = {"max_tokens": 64, "messages": ASK}
    _, response = await _served(client, gpt_oss, "/v1/messages", body, PIECES)
    assert response.json()["content"] == [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                          {"type": "text", "text": ANSWER}]
    tools = [{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}]
    _, response = await _served(client, gpt_oss, "/v1/messages", {**body, "tools": tools}, CALL)
    reply = response.json()
    assert reply["stop_reason"] == "tool_use"
    assert [b["type"] for b in reply["content"]] == ["thinking", "tool_use"]
    assert reply["content"][1]["input"] == {"city": "Paris"}
    turn = [*ASK, {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply["content"][1]["id"],
                                          "content": "sunny"}]}]
    job, _ = await _served(client, gpt_oss, "/v1/messages", {**body, "tools": tools, "messages": turn,
                                                             "stream": True}, PIECES)
    assert job.messages[1].reasoning == THOUGHT
    _, response = await _served(client, gpt_oss, "/v1/messages", {**body, "stream": True}, PIECES)
    deltas = [e["delta"] for name, e in sse_events(response.content) if name == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == THOUGHT
    assert "".join(d.get("text", "") for d in deltas) == ANSWER


async def test_ollama_gets_thinking_and_tool_calls(client: httpx.AsyncClient, gpt_oss: Any) -> None:
    body = {"messages": ASK, "stream": False, "think": "low"}
    job, response = await _served(client, gpt_oss, "/api/chat", body, PIECES)
    assert job.template_kwargs == {"enable_thinking": True, "reasoning_effort": "low"}
    message = response.json()["message"]
    assert (message["thinking"], message["content"]) == (THOUGHT, ANSWER)
    _, response = await _served(client, gpt_oss, "/api/chat", {**body, "tools": [TOOL]}, CALL)
    message = response.json()["message"]
    function = message["tool_calls"][0]["function"]
    assert (function["name"], function["arguments"]) == ("get_weather", {"city": "Paris"})
    history = [*ASK, message, {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]
    job, _ = await _served(client, gpt_oss, "/api/chat", {**body, "tools": [TOOL], "messages": history}, PIECES)
    assert job.messages[1].reasoning == THOUGHT
    _, response = await _served(client, gpt_oss, "/api/chat", {**body, "stream": True}, PIECES)
    lines = [json.loads(line) for line in response.content.splitlines() if line.strip()]
    assert "".join(line["message"].get("thinking", "") for line in lines) == THOUGHT
    assert "".join(line["message"]["content"] for line in lines) == ANSWER


async def test_responses_gets_a_reasoning_item_and_a_function_call(client: httpx.AsyncClient, gpt_oss: Any) -> None:
    body = {"input": "Weather in Paris?", "reasoning": {"effort": "high"}}
    job, response = await _served(client, gpt_oss, "/v1/responses", body, PIECES)
    assert job.template_kwargs == {"reasoning_effort": "high"}
    output = response.json()["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"][0]["text"] == THOUGHT and output[1]["content"][0]["text"] == ANSWER
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}]
    _, response = await _served(client, gpt_oss, "/v1/responses", {**body, "tools": tools}, CALL)
    output = response.json()["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call"]
    assert json.loads(output[1]["arguments"]) == {"city": "Paris"}
    follow_up = {"previous_response_id": response.json()["id"], "tools": tools,
                 "input": [{"type": "function_call_output", "call_id": output[1]["call_id"], "output": "sunny"}]}
    job, _ = await _served(client, gpt_oss, "/v1/responses", follow_up, PIECES)
    assert (job.messages[1].reasoning, job.messages[1].tool_calls[0].name) == (THOUGHT, "get_weather")
    assert response.json()["reasoning"]["effort"] == "high"
    _, response = await _served(client, gpt_oss, "/v1/responses", {**body, "stream": True}, PIECES)
    events = [data for _, data in sse_events(response.content)]
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == THOUGHT
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == ANSWER


@pytest.mark.parametrize(("path", "body", "kwargs"), [
    ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "low"}, {"reasoning_effort": "low"}),
    ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "high",
                              "chat_template_kwargs": {"reasoning_effort": "low"}}, {"reasoning_effort": "high"}),
    ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "none"}, {"enable_thinking": False}),
    ("/v1/messages", {"max_tokens": 16, "messages": ASK, "output_config": {"effort": "medium"}},
     {"reasoning_effort": "medium"}),
])
async def test_the_reasoning_effort_reaches_the_template(client: httpx.AsyncClient, gpt_oss: Any, path: str,
                                                         body: dict[str, Any], kwargs: dict[str, Any]) -> None:
    job, response = await _served(client, gpt_oss, path, body, PIECES)
    assert job.template_kwargs == kwargs and response.status_code == 200


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "max"}, "reasoning_effort"),
    ("/v1/responses", {"input": "hi", "reasoning": {"effort": "max"}}, "reasoning.effort"),
    ("/v1/responses", {"input": "hi", "reasoning": "high"}, "reasoning"),
    ("/v1/messages", {"max_tokens": 8, "messages": ASK, "output_config": {"effort": "max"}}, "output_config.effort"),
])
async def test_a_bad_effort_is_a_400(client: httpx.AsyncClient, path: str, body: dict[str, Any], param: str) -> None:
    response = await client.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert param in (error.get("param") or error.get("message")), error


async def test_the_official_clients_read_the_split(app_client: tuple[Any, httpx.AsyncClient], gpt_oss: Any) -> None:
    """The openai and ollama clients, unmodified, over the gateway app: reasoning apart from the answer on chat,
    Responses and Ollama (the worker a stub that writes harmony; the parsing the gateway's own)."""
    import openai

    app, _ = app_client
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        client = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", http_client=http, max_retries=0)

        async def answered(call: Any, pieces: list[str]) -> Any:
            task = asyncio.create_task(call)
            await gpt_oss.answer(await gpt_oss.take(), pieces)
            return await task

        chat = await answered(client.chat.completions.create(model=MODEL, messages=ASK), PIECES)
        message = chat.choices[0].message
        assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)  # type: ignore[attr-defined]
        response = await answered(client.responses.create(model=MODEL, input="Weather in Paris?"), PIECES)
        assert response.output_text == ANSWER and response.output[0].type == "reasoning"
        assert response.output[0].content[0].text == THOUGHT
    ollama = pytest.importorskip("ollama")
    local = ollama.AsyncClient(host="http://gateway", transport=httpx.ASGITransport(app=app))
    reply = await answered(local.chat(model=MODEL, messages=ASK, think=True), PIECES)
    assert (reply.message.thinking, reply.message.content) == (THOUGHT, ANSWER)
