"""/openapi.json matches what the gateway accepts: schemathesis fuzzes every documented operation (bounded) against
a real gateway, a real Redis and a real worker on the tiny model; no 5xx, and every error in OpenAI's shape."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.admin.openapi import openapi_document
from shared.settings import Settings

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "tiny"
SETTINGS = dataclasses.replace(Settings(), max_tokens_limit=8, default_max_tokens=8, max_n=2,
                               heartbeat_interval_s=0.5, heartbeat_ttl_s=5, registry_cache_s=0, slots=8)


def _document() -> dict[str, Any]:
    """The gateway's document, with `model` held to the one model served (any other name is a documented 404,
    which would leave the worker path unexercised)."""
    doc = openapi_document(SETTINGS)
    for schema in doc["components"]["schemas"].values():
        if "model" in schema.get("properties", {}) and schema["properties"]["model"].get("type") == "string":
            schema["properties"]["model"] = {"const": MODEL}
    return doc


# the OpenAI-shaped operations (the Anthropic, Ollama and admin entries answer in their own shapes; the batch API
# needs a batch runner): tests/gateway/admin/test_openapi_routes.py checks the document lists every route
schema = schemathesis.openapi.from_dict(_document()).include(tag_regex="^(openai|llama-server|health)$")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """uvicorn serving the gateway on a free port, a real Redis, and a WorkerRunner over the tiny chat model."""
    import redis
    import uvicorn

    from gateway.app import create_app
    from llmfleet.redis_server import BundledRedis
    from tests.support.tiny_gguf import write_tiny_gguf
    from worker.engine.engine import Engine
    from worker.engine.text.chat_template import CHATML_TEMPLATE
    from worker.serve.runner import WorkerRunner

    try:
        server = BundledRedis().start()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    settings = dataclasses.replace(SETTINGS, redis_url=server.url, port=_free_port())
    engine = Engine.load(write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf"), chat_template=CHATML_TEMPLATE)
    worker = WorkerRunner(engine, redis.Redis.from_url(server.url), settings, model=MODEL)
    threading.Thread(target=worker.run, daemon=True).start()
    assert worker.ready.wait(10)
    gateway = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=settings.port,
                                            log_level="warning"))
    threading.Thread(target=gateway.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not gateway.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{settings.port}"
    gateway.should_exit = True
    worker.stop_requested.set()
    time.sleep(0.5)
    server.stop()


def test_the_document_is_served_with_the_configured_limits() -> None:
    doc = openapi_document(SETTINGS)
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == 8 and chat["n"]["anyOf"][0]["maximum"] == 2
    assert {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/tokenize",
            "/detokenize", "/apply-template"} <= set(doc["paths"])


@schema.parametrize()
@hypothesis_settings(max_examples=25, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                            HealthCheck.function_scoped_fixture])
def test_no_5xx_and_only_openai_shaped_errors(case: Any, base_url: str) -> None:
    response = case.call_and_validate(base_url=base_url, timeout=60, checks=[
        not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], response.text
