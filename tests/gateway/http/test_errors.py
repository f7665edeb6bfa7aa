"""Every refusal is an OpenAI-shaped error with the right status, param and headers."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import fakeredis
import httpx
import pytest

from gateway.app import ERROR_SHAPES, create_app
from gateway.http.errors import ErrorShape, error_response
from shared import keys
from shared.errors import NotFound
from shared.settings import Settings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {"model": "smollm2", "messages": MESSAGES}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


def _nested(depth: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", _chat(model=...), "model"),
        ("/v1/chat/completions", _chat(model=7), "model"),
        ("/v1/chat/completions", _chat(messages=...), "messages"),
        ("/v1/chat/completions", _chat(messages=[]), "messages"),
        ("/v1/chat/completions", _chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content[0]"),
        ("/v1/chat/completions", _chat(temperature=2.5), "temperature"),
        ("/v1/chat/completions", _chat(temperature="hot"), "temperature"),
        ("/v1/chat/completions", _chat(top_p=0), "top_p"),
        ("/v1/chat/completions", _chat(n=0), "n"),
        ("/v1/chat/completions", _chat(n=1000), "n"),
        ("/v1/chat/completions", _chat(max_tokens=0), "max_tokens"),
        ("/v1/chat/completions", _chat(max_tokens=10**9), "max_tokens"),
        ("/v1/chat/completions", _chat(max_completion_tokens=1.5), "max_completion_tokens"),
        ("/v1/chat/completions", _chat(stream="yes"), "stream"),
        ("/v1/chat/completions", _chat(stream_options={"include_usage": True}), "stream_options"),
        ("/v1/chat/completions", _chat(stop=["a", "b", "c", "d", "e"]), "stop"),
        ("/v1/chat/completions", _chat(stop=[1]), "stop"),
        ("/v1/chat/completions", _chat(presence_penalty=-3), "presence_penalty"),
        ("/v1/chat/completions", _chat(frequency_penalty=2.01), "frequency_penalty"),
        ("/v1/chat/completions", _chat(logit_bias={"abc": 1}), "logit_bias"),
        ("/v1/chat/completions", _chat(logit_bias={"5": 101}), "logit_bias"),
        ("/v1/chat/completions", _chat(top_logprobs=3), "top_logprobs"),
        ("/v1/chat/completions", _chat(logprobs=True, top_logprobs=21), "top_logprobs"),
        ("/v1/chat/completions", _chat(seed="1"), "seed"),
        ("/v1/chat/completions", _chat(priority="urgent"), "priority"),
        ("/v1/chat/completions", _chat(tools=[{"type": "function"}]), "tools[0].function"),
        ("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"description": "x"}}]),
         "tools[0].function.name"),
        ("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
         "tools[0].function.parameters"),
        ("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                       tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice"),
        ("/v1/chat/completions", _chat(tool_choice="required"), "tool_choice"),
        ("/v1/chat/completions", _chat(functions=[{"name": "f"}]), "functions"),
        ("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                       response_format={"type": "json_object"}), "response_format"),
        ("/v1/chat/completions", _chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
        ("/v1/chat/completions", _chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c"}]}]),
         "messages[0].tool_calls[0]"),
        ("/v1/chat/completions", _chat(response_format={"type": "xml"}), "response_format.type"),
        ("/v1/chat/completions", _chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
        ("/v1/chat/completions", _chat(response_format={"type": "json_schema", "json_schema": {"name": "a b"}}),
         "response_format.json_schema.name"),
        ("/v1/chat/completions", _chat(response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": [1]}}),
         "response_format.json_schema.schema"),
        ("/v1/chat/completions", _chat(json_schema={"type": "array", "items": _nested(40)}), "json_schema"),
        ("/v1/chat/completions", _chat(grammar=""), "grammar"),
        ("/v1/chat/completions", _chat(grammar="root ::= \"a\"", regex="a"), "regex"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "regex": "a" * 70_000}, "regex"),
        ("/v1/completions", {"model": "smollm2"}, "prompt"),
        ("/v1/completions", {"model": "smollm2", "prompt": []}, "prompt"),
        ("/v1/completions", {"model": "smollm2", "prompt": [1, -2]}, "prompt"),
        ("/v1/completions", {"model": "smollm2", "prompt": ["a", [1]]}, "prompt"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "logprobs": 6}, "logprobs"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "echo": 1}, "echo"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "suffix": "end"}, "suffix"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "best_of": 3}, "best_of"),
        ("/v1/embeddings", {"model": "e"}, "input"),
        ("/v1/embeddings", {"model": "e", "input": ""}, "input"),
        ("/v1/embeddings", {"model": "e", "input": "x", "dimensions": 64}, "dimensions"),
        ("/v1/embeddings", {"model": "e", "input": "x", "encoding_format": "int8"}, "encoding_format"),
    ],
)
async def test_validation_errors_name_the_param(client, path: str, body: dict[str, object], param: str) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param.split("[")[0] in error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'{"model": NaN}', b"\xff\xfe"])
async def test_bodies_that_are_not_json_objects(client, raw: bytes) -> None:
    response = await client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["param"] is None


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
         "messages[0].content"),
        ("/v1/chat/completions", b'{"model": "m\\udfff", "messages": [{"role": "user", "content": "hi"}]}', "model"),
        ("/v1/chat/completions",
         b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "\\ud800b"]}', "stop[1]"),
        ("/v1/completions", b'{"model": "m", "prompt": ["ok", "\\udc00"]}', "prompt[1]"),
        ("/v1/embeddings", b'{"model": "m", "input": "\\ud83d"}', "input"),
    ],
)
async def test_lone_surrogates_are_a_400_naming_the_field(client, path: str, raw: bytes, param: str) -> None:
    """JSON allows "\\ud800"; UTF-8 (and so the wire) does not: refuse it clearly instead of a 500."""
    response = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"]
    assert response.headers.get("connection") != "close"
    ok = await client.post(path, content=raw.replace(b"\\u", b"u"), headers={"content-type": "application/json"})
    assert ok.status_code != 500  # a well-formed variant of the same body is not refused for this reason


async def test_unknown_fields_are_ignored_like_openai(client, worker) -> None:
    # An unknown model is only found out at admission, after validation: the unknown field passed.
    response = await client.post("/v1/chat/completions", json=_chat(model="nope", frobnicate=True))
    assert response.status_code == 404


async def test_unknown_model_is_404_model_not_found(client, worker) -> None:
    response = await client.post("/v1/chat/completions", json=_chat(model="gpt-9"))
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model 'gpt-9' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


async def test_known_model_without_live_worker_is_503_with_retry_after(app_client, redis) -> None:
    app, client = app_client  # LLMFLEET_WORKER_WAIT_S=0: no wait for a worker (tests/gateway/cluster/test_worker_wait.py)
    app.state.broker.settings = dataclasses.replace(app.state.broker.settings, worker_wait_s=0)
    await redis.zadd(keys.MODELS_INDEX, {"smollm2": time.time() - 60})  # served a minute ago, worker gone
    response = await client.post("/v1/chat/completions", json=_chat())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.json()["error"]["code"] == "no_worker_available"


@pytest.mark.parametrize(
    "fields",
    [{"state": "draining"}, {"version": 99}, {"heartbeat": time.time() - 3600}, {"model": ""}],
    ids=["draining", "other-wire-version", "stale-heartbeat", "no-model"],
)
async def test_workers_that_do_not_count_as_live(app_client, redis, make_worker, fields: dict[str, object]) -> None:
    app, client = app_client
    app.state.broker.settings = dataclasses.replace(app.state.broker.settings, worker_wait_s=0)  # 503 at once
    await make_worker().register(**fields)
    await redis.zadd(keys.MODELS_INDEX, {"smollm2": time.time()})
    response = await client.post("/v1/chat/completions", json=_chat())
    assert response.status_code == 503


async def test_queue_full_is_429_with_retry_after(client, worker, redis, settings) -> None:
    stream = keys.jobs_stream("smollm2")
    await redis.xgroup_create(stream, keys.JOBS_GROUP, id="0", mkstream=True)
    for _ in range(settings.queue_limit):
        await redis.xadd(stream, {keys.JOB_FIELD: b"waiting"})
    response = await client.post("/v1/chat/completions", json=_chat())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert await redis.xlen(stream) == settings.queue_limit  # nothing was added


async def test_body_too_large_is_413_by_content_length(client) -> None:
    big = b'{"model": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    response = await client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_body_too_large_is_413_when_chunked(client) -> None:
    async def chunks():
        """A body sent chunked, with no Content-Length."""
        for _ in range(40):
            yield b"x" * 65536

    response = await client.post("/v1/chat/completions", content=chunks())
    assert "content-length" not in response.request.headers
    assert response.status_code == 413


async def test_unknown_url_and_wrong_method_are_openai_errors(client) -> None:
    response = await client.post("/v1/nothing", json={})
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": "Invalid URL (POST /v1/nothing)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    response = await client.get("/v1/chat/completions")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_redis_down_is_503_unavailable(client, server, worker) -> None:
    server.connected = False
    response = await client.post("/v1/chat/completions", json=_chat())
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "unavailable"
    assert "retry-after" in response.headers
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/ready")).status_code == 503


@pytest.fixture
async def keyed_client(server: fakeredis.FakeServer):
    """A gateway that requires an API key."""
    app = create_app(Settings(api_key="sk-right", registry_cache_s=0.0), redis=fakeredis.FakeAsyncRedis(server=server))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


async def test_api_key_required_when_configured(keyed_client) -> None:
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-right"}):
        response = await keyed_client.get("/v1/models", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    response = await keyed_client.get("/v1/models", headers={"Authorization": "Bearer sk-right"})
    assert response.status_code == 200
    assert (await keyed_client.get("/health")).status_code == 200  # probes need no key


def test_an_error_takes_the_shape_registered_for_its_path_else_openais() -> None:
    """http/ knows no API's error shape: app.py registers Anthropic's and Ollama's on app.state.error_shapes."""
    error = NotFound("no such thing")
    plain = json.loads(error_response(error, "/api/tags").body)
    assert plain == error.to_openai()
    state = SimpleNamespace(error_shapes=(ErrorShape(lambda path: path.startswith("/x/"), lambda e: {"x": e.message}),))
    assert json.loads(error_response(error, "/x/y", state).body) == {"x": "no such thing"}
    assert json.loads(error_response(error, "/v1/chat/completions", state).body) == error.to_openai()
    registered = SimpleNamespace(error_shapes=ERROR_SHAPES)
    assert json.loads(error_response(error, "/api/tags", registered).body) == {"error": "no such thing"}
    assert json.loads(error_response(error, "/v1/messages", registered).body)["type"] == "error"
