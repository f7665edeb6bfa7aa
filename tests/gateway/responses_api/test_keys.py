"""The Responses API behind API keys: the same key check as every route, and a stored response is seen only by
the key that made it (another key gets the 404 an unknown id gets)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from gateway.http import api_keys
from shared.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(api_keys, "RELOAD_EVERY_S", 0.0)  # keys added during the test count at once
    return tmp_path / "keys.json"


@pytest.fixture
def settings(key_file: Path) -> Settings:
    """The gateway conftest's settings, with a key file."""
    return dataclasses.replace(Settings(registry_cache_s=0.0, request_timeout_s=5.0, deadline_grace_s=0.05),
                               keys_file=str(key_file))


async def test_a_stored_response_belongs_to_its_key(client, worker, key_file: Path) -> None:
    alice = {"Authorization": f"Bearer {api_keys.add(key_file, 'alice')}"}
    bob = {"Authorization": f"Bearer {api_keys.add(key_file, 'bob')}"}
    refused = await client.post("/v1/responses", json={"model": "smollm2", "input": "Hi"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    task = asyncio.create_task(client.post("/v1/responses", json={"model": "smollm2", "input": "Hi"}, headers=alice))
    job = await worker.take()
    await worker.answer(job, ["Hello"])
    made = (await task).json()
    assert (await client.get(f"/v1/responses/{made['id']}", headers=alice)).json() == made
    assert (await client.get(f"/v1/responses/{made['id']}", headers=bob)).status_code == 404
    assert (await client.delete(f"/v1/responses/{made['id']}", headers=bob)).status_code == 404
    assert (await client.post(f"/v1/responses/{made['id']}/cancel", headers=bob)).status_code == 404
    continued = await client.post("/v1/responses", headers=bob, json={
        "model": "smollm2", "input": "Again", "previous_response_id": made["id"]})
    assert continued.status_code == 404 and continued.json()["error"]["code"] == "previous_response_not_found"
    assert (await client.delete(f"/v1/responses/{made['id']}", headers=alice)).json()["deleted"] is True
