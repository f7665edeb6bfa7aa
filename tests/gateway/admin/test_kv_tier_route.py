"""gateway.admin.model_routes: POST /admin/kv-tier/drop bumps the model's drop counter, which every worker of the model
reads with its heartbeat (tests/worker/serve/test_heartbeat.py)."""

from __future__ import annotations

import fakeredis
import httpx
import pytest

from shared import keys

pytestmark = pytest.mark.anyio


async def test_drop_bumps_the_models_counter(client: httpx.AsyncClient, redis: fakeredis.FakeAsyncRedis) -> None:
    first = await client.post("/admin/kv-tier/drop", json={"model": "smollm2"})
    second = await client.post("/admin/kv-tier/drop", json={"model": "smollm2"})
    assert first.status_code == second.status_code == 200
    assert second.json() == {"object": "kv_tier.drop", "model": "smollm2", "drops": 2}
    assert int(await redis.get(keys.kv_tier_drop("smollm2"))) == 2
    assert (await client.post("/admin/kv-tier/drop", json={})).status_code == 400
