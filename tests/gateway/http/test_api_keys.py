"""API keys and per-key limits: hashed key file, both auth headers, revocation without restart, and
requests/tokens per minute shared by two gateways through one real Redis."""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.http import api_keys
from gateway.replies.request_events import charge_key
from shared.settings import Settings

pytestmark = pytest.mark.anyio


def test_the_key_file_keeps_digests_only(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key = api_keys.add(path, "alice", rpm=60, tpm=1000)
    assert key.startswith(api_keys.KEY_PREFIX) and key not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    [record] = api_keys.load(path)
    assert (record.name, record.rpm, record.tpm, record.digest) == ("alice", 60, 1000, api_keys.digest_of(key))
    with pytest.raises(api_keys.KeyFileError, match="already exists"):
        api_keys.add(path, "alice")
    store = api_keys.KeyStore(path)
    assert store.lookup(key) == record and store.lookup(key + "x") is None
    api_keys.revoke(path, "alice")
    with pytest.raises(api_keys.KeyFileError, match="no key named 'alice'"):
        api_keys.revoke(path, "alice")


@pytest.fixture
async def gateways(redis_server: Any, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[list[httpx.AsyncClient], Path]]:
    """Two gateway apps on one real Redis, reading one key file (re-read at once when it changes)."""
    monkeypatch.setattr(api_keys, "RELOAD_EVERY_S", 0.0)
    path = tmp_path / "keys.json"
    settings = dataclasses.replace(Settings(), redis_url=redis_server.url, keys_file=str(path))
    clients, apps, redises = [], [], []
    for _ in range(2):
        redis = Redis.from_url(redis_server.url)
        app = create_app(settings, redis=redis)
        await app.router.lifespan_context(app).__aenter__()
        apps.append(app)
        redises.append(redis)
        clients.append(httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw"))
    yield clients, path
    for client, redis in zip(clients, redises):
        await client.aclose()
        await redis.aclose()


async def test_61st_request_in_a_minute_is_a_429_across_two_gateways(gateways: Any) -> None:
    (one, two), path = gateways
    key = api_keys.add(path, "team-a", rpm=60)
    for i in range(60):  # alternate gateways: the limit is shared through Redis
        gateway = one if i % 2 else two
        headers = {"Authorization": f"Bearer {key}"} if i % 3 else {"X-Api-Key": key}
        response = await gateway.get("/v1/models", headers=headers)
        assert response.status_code == 200, (i, response.text)
        assert response.headers["x-ratelimit-limit-requests"] == "60"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    refused = await one.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and "team-a" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) >= 1 and refused.headers["x-ratelimit-remaining-requests"] == "0"
    other = api_keys.add(path, "team-b", rpm=60)  # limits are per key
    assert (await two.get("/v1/models", headers={"Authorization": f"Bearer {other}"})).status_code == 200
    metrics = (await one.get("/metrics")).text
    assert 'llmfleet_api_key_rate_limited_total{key="team-a",limit="requests"} 1.0' in metrics


async def test_a_revoked_key_is_refused_without_a_restart(gateways: Any) -> None:
    (one, _), path = gateways
    key = api_keys.add(path, "temp")
    assert (await one.get("/v1/models", headers={"Authorization": f"Bearer {key}"})).status_code == 200
    api_keys.revoke(path, "temp")
    refused = await one.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert (await one.get("/health")).status_code == 200 and (await one.get("/metrics")).status_code == 200


async def test_spent_tokens_refuse_the_next_request_until_they_recover(gateways: Any) -> None:
    (one, two), path = gateways
    key = api_keys.add(path, "tokens", tpm=1000)
    [record] = [r for r in api_keys.load(path) if r.name == "tokens"]
    ok = await one.get("/v1/models", headers={"X-Api-Key": key})
    assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-tokens"] == "1000"
    broker = one._transport.app.state.broker  # type: ignore[attr-defined]
    await charge_key(broker, record, 1500)  # a finished request used more than the minute's allowance
    refused = await two.get("/v1/models", headers={"X-Api-Key": key})
    assert refused.status_code == 429 and "tokens per minute" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 31


async def test_metrics_can_be_closed_to_requests_without_a_key(tmp_path: Path) -> None:
    import fakeredis

    path = tmp_path / "keys.json"
    key = api_keys.add(path, "ops")
    settings = dataclasses.replace(Settings(), keys_file=str(path), public_metrics=0)
    app = create_app(settings, redis=fakeredis.FakeAsyncRedis())
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers={"X-Api-Key": key})).status_code == 200
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/openapi.json")).status_code == 200
