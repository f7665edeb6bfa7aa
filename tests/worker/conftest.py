"""Fixtures for worker tests: an Engine over the tiny random GGUF."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shared.settings import Settings
from tests.support.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory):
    """An Engine (model, tokenizer, template) over a tiny random-weight GGUF."""
    from worker.engine.engine import Engine

    return Engine.load(write_tiny_gguf(tmp_path_factory.mktemp("tiny-engine") / "tiny.gguf"))


@pytest.fixture(scope="session")
def tiny_chat_engine(tmp_path_factory: pytest.TempPathFactory):
    """The tiny Engine with a ChatML chat template (the tiny GGUF itself has none, like a base model)."""
    from worker.engine.engine import Engine
    from worker.engine.text.chat_template import CHATML_TEMPLATE

    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny-chat-engine") / "tiny.gguf")
    return Engine.load(path, chat_template=CHATML_TEMPLATE)


@pytest.fixture()
def client(redis_server: Any) -> redis.Redis:
    """A client of the test's real Redis server."""
    return redis.Redis.from_url(redis_server.url)


@pytest.fixture()
def settings(redis_server: Any) -> Settings:
    """Worker settings on that server, with fast heartbeats and short leases."""
    return Settings(redis_url=redis_server.url, heartbeat_interval_s=0.2, heartbeat_ttl_s=1.0, lease_s=0.5, slots=4)
