"""Issue 42: Ollama's /api/pull through the unmodified ollama client (FakeRedis): a known name runs `llmfleet pull`'s
code (worker.models.pull) into the model cache ($LLMFLEET_CACHE, here a temporary folder) with Ollama's progress
objects; a node's catalogue id is known too; an unknown name is a 404 that lists the known ones; a failed pull is
Ollama's error line (streamed) or a 502 (not streamed). Downloads are not run here (no network): a cached file is
what `llmfleet pull` finds, and a cache that cannot be made is a real failure; a pull still under way is a stand-in
for worker.models.pull that waits."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import pytest

from gateway.ollama import pull as pulling
from shared import keys
from shared.warm_pool import NodeState
from worker.models import KNOWN_MODELS

ollama = pytest.importorskip("ollama")
pytestmark = pytest.mark.anyio
SMOL = KNOWN_MODELS["smollm2-135m"]


@pytest.fixture
def sdk(app_client: tuple[Any, httpx.AsyncClient]) -> Any:
    app, _ = app_client
    return ollama.AsyncClient(host="http://gateway", transport=httpx.ASGITransport(app=app))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache that already holds SmolLM2's file (what a finished `llmfleet pull` leaves)."""
    monkeypatch.setenv("LLMFLEET_CACHE", str(tmp_path))
    (tmp_path / SMOL.alias).mkdir()
    (tmp_path / SMOL.alias / SMOL.filename).write_bytes(b"GGUF" + bytes(96))
    return tmp_path


async def _node(redis: fakeredis.FakeAsyncRedis, catalogue: dict[str, str]) -> None:
    state = NodeState(node_id="n1", heartbeat=time.time(), max_loaded=2, memory_budget=2**30, catalogue=catalogue)
    await redis.hset(keys.node_key("n1"), mapping=state.to_hash())
    await redis.zadd(keys.NODES_INDEX, {"n1": state.heartbeat})


@pytest.mark.parametrize("name", ["smollm2", "smollm2-135m:latest", "SmolLM2-135M-Instruct"])
async def test_a_known_model_streams_ollamas_progress_objects(sdk, cache: Path, name: str) -> None:
    updates = [update async for update in await sdk.pull(name, stream=True)]
    digest = f"sha256:{SMOL.sha256}"
    assert [u.status for u in updates] == ["pulling manifest", f"pulling {SMOL.sha256[:12]}",
                                           "verifying sha256 digest", "writing manifest", "success"]
    assert (updates[1].digest, updates[1].total, updates[1].completed) == (digest, 100, 100)
    assert (await sdk.pull(name, stream=False)).status == "success"


async def test_an_unknown_name_is_a_404_listing_the_known_names(sdk, client, redis, cache: Path) -> None:
    await _node(redis, {"house-model": "/models/house.gguf"})
    with pytest.raises(ollama.ResponseError) as caught:
        await sdk.pull("llama3:8b")
    assert caught.value.status_code == 404
    message = caught.value.error
    assert message.startswith("pull model manifest: file does not exist: 'llama3:8b'")
    assert all(name in message for name in [*KNOWN_MODELS, "house-model"])
    response = await client.post("/api/pull", json={})  # no default to the model served: a pull names its model
    assert response.status_code == 400 and response.json() == {"error": "model is required"}
    response = await client.post("/api/pull", json={"name": "smollm2", "stream": "yes"})  # older clients: name
    assert response.status_code == 400 and "stream" in response.json()["error"]


async def test_a_catalogue_id_is_known(sdk, redis, cache: Path) -> None:
    """Its source: a known alias is pulled here; a file path or hf: name is the node agent's to resolve."""
    await _node(redis, {"chat": "smollm2-135m", "house-model": "/models/house.gguf"})
    updates = [u.status async for u in await sdk.pull("chat", stream=True)]
    assert updates[-1] == "success" and f"pulling {SMOL.sha256[:12]}" in updates
    assert [u.status async for u in await sdk.pull("house-model", stream=True)] == ["pulling manifest", "success"]


async def test_a_pull_that_fails_is_ollamas_error(sdk, client, tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("LLMFLEET_CACHE", str(blocker))  # the cache folder cannot be made: worker.models.pull fails
    response = await client.post("/api/pull", json={"model": "smollm2"})
    lines = [line for line in response.text.splitlines() if line]
    assert response.status_code == 200 and lines[0] == '{"status":"pulling manifest"}'
    assert '"error":"pull failed: ' in lines[-1] and "success" not in response.text
    with pytest.raises(ollama.ResponseError) as caught:
        await sdk.pull("smollm2", stream=False)
    assert caught.value.status_code == 502 and caught.value.error.startswith("pull failed: ")


async def test_pulls_of_one_model_share_one_download_that_reports_progress(sdk, monkeypatch) -> None:
    release, calls = threading.Event(), []

    def slow_pull(name: str, *, progress: bool) -> Path:
        calls.append((name, progress))
        assert release.wait(10)
        path = Path(__file__)
        return path

    monkeypatch.setattr(pulling, "pull", slow_pull)
    monkeypatch.setattr(pulling, "PROGRESS_EVERY_S", 0.05)

    async def statuses() -> list[Any]:
        return [u async for u in await sdk.pull("smollm2", stream=True)]

    first, second = asyncio.create_task(statuses()), asyncio.create_task(statuses())
    await asyncio.sleep(0.5)
    release.set()
    for updates in await asyncio.gather(first, second):
        waiting = [u for u in updates if u.status.startswith("pulling ") and u.total is None]
        assert len(waiting) >= 2 and updates[-1].status == "success"  # progress lines while the download ran
    assert calls == [("smollm2-135m", False)]  # one download, without the CLI's progress bars
