"""API keys and their rate limits guard Ollama's routes as they guard /v1 (real Redis: the limiter's scripts), and
refuse in Ollama's shape, which the ollama client raises as ResponseError."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.http import api_keys
from shared.settings import Settings

ollama = pytest.importorskip("ollama")
pytestmark = pytest.mark.anyio


@pytest.fixture
async def gateway(redis_server: Any, tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    """A gateway app on a real Redis with one key, limited to one request per minute."""
    path = tmp_path / "keys.json"
    key = api_keys.add(path, "team-a", rpm=1)
    redis = Redis.from_url(redis_server.url)
    app = create_app(dataclasses.replace(Settings(), redis_url=redis_server.url, keys_file=str(path)), redis=redis)
    async with app.router.lifespan_context(app):
        yield app, key
    await redis.aclose()


def _client(app: Any, key: str | None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return ollama.AsyncClient(host="http://gateway", transport=httpx.ASGITransport(app=app), headers=headers)


async def test_a_key_is_required_and_its_rate_limit_applies(gateway: Any) -> None:
    app, key = gateway
    with pytest.raises(ollama.ResponseError) as refused:
        await _client(app, None).chat(model="smollm2", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert refused.value.status_code == 401 and "API key" in refused.value.error
    sdk = _client(app, key)
    assert (await sdk.list()).models == []
    with pytest.raises(ollama.ResponseError) as limited:
        await sdk.list()
    assert limited.value.status_code == 429 and "team-a" in limited.value.error
