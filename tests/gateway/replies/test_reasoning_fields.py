"""Issue 42: chat completions carry the reasoning as vLLM's `reasoning` beside `reasoning_content` (the same text,
collected and streamed), LLMFLEET_REASONING_FIELDS turns either off, and assistant turns may send either back
(FakeRedis and a fake worker; SmolLM2 end to end is in tests/integration/test_reasoning_api.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import httpx
import pytest

from gateway.app import create_app
from shared.settings import Settings, SettingsError
from tests.gateway.conftest import MODEL, sse_payloads
from tests.gateway.replies.test_reasoning_routes import ANSWER, ASK, PIECES, THOUGHT, _chat

pytestmark = pytest.mark.anyio
KEYS = ("reasoning", "reasoning_content")


@pytest.fixture(params=["both", "reasoning", "reasoning_content"])
async def fields_client(request: pytest.FixtureRequest, settings: Settings,
                        server: fakeredis.FakeServer) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A gateway started with LLMFLEET_REASONING_FIELDS set to each value."""
    app = create_app(dataclasses.replace(settings, reasoning_fields=request.param),
                     redis=fakeredis.FakeAsyncRedis(server=server))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://g") as http:
        yield request.param, http


async def test_the_setting_names_the_fields_collected_and_streamed(fields_client, worker) -> None:
    fields, client = fields_client
    wanted = KEYS if fields == "both" else (fields,)
    message = (await _chat(client, worker, PIECES)).json()["choices"][0]["message"]
    assert {k: message.get(k) for k in KEYS} == {k: THOUGHT if k in wanted else None for k in KEYS}
    assert message["content"] == ANSWER
    response = await _chat(client, worker, PIECES, stream=True)
    deltas = [p["choices"][0]["delta"] for p in sse_payloads(response.content)[:-1] if p["choices"]]
    thinking = [d for d in deltas if set(d) & set(KEYS)]
    assert thinking and all(set(d) == set(wanted) and len(set(d.values())) == 1 for d in thinking)
    assert "".join(d[wanted[0]] for d in thinking) == THOUGHT
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER


def test_the_setting_is_checked_with_the_variables_name() -> None:
    assert Settings.from_env({"LLMFLEET_REASONING_FIELDS": "Reasoning"}).reasoning_fields == "reasoning"
    assert Settings().reasoning_fields == "both"
    with pytest.raises(SettingsError, match="LLMFLEET_REASONING_FIELDS: must be one of both, reasoning, "
                                            "reasoning_content"):
        Settings.from_env({"LLMFLEET_REASONING_FIELDS": "thinking"})


@pytest.mark.parametrize("past", [{"reasoning": "It is odd."}, {"reasoning_content": "It is odd."},
                                  {"reasoning": "It is odd.", "reasoning_content": "Older name."}])
async def test_an_assistant_turn_may_send_its_reasoning_back(client: httpx.AsyncClient, worker,
                                                            past: dict[str, Any]) -> None:
    """Accepted under either name, or both; not part of the next prompt."""
    history = [*ASK, {"role": "assistant", "content": "Yes.", **past}, {"role": "user", "content": "And 9?"}]
    task = asyncio.create_task(client.post("/v1/chat/completions", json={"model": MODEL, "messages": history}))
    job = await worker.take()
    assert [(m.role, m.content) for m in job.messages] == [("user", ASK[0]["content"]), ("assistant", "Yes."),
                                                           ("user", "And 9?")]
    await worker.answer(job, ["No."])
    assert (await task).status_code == 200


@pytest.mark.parametrize("name", KEYS)
async def test_reasoning_that_is_not_text_is_a_400_naming_the_field(client: httpx.AsyncClient, name: str) -> None:
    history = [*ASK, {"role": "assistant", "content": "Yes.", name: ["odd"]}, {"role": "user", "content": "And 9?"}]
    response = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": history})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == f"messages[1].{name}" and error["type"] == "invalid_request_error"
