"""llama-server's /tokenize, /detokenize and /apply-template: the jobs the gateway queues and the bodies it answers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from shared.messages import TextJob, TokenPiece

pytestmark = pytest.mark.anyio


async def _served(client: httpx.AsyncClient, worker: Any, path: str, body: dict[str, Any],
                  **answer: Any) -> tuple[TextJob, httpx.Response]:
    task = asyncio.create_task(client.post(path, json=body))
    job = await worker.take()
    await worker.done(job, prompt_tokens=0, completion_tokens=0, **answer)
    return job, await task


async def test_tokenize_queues_a_text_job_with_llama_servers_defaults(client: httpx.AsyncClient, worker: Any) -> None:
    job, reply = await _served(client, worker, "/tokenize", {"content": "Hello world"}, tokens=[19556, 905])
    assert isinstance(job, TextJob) and job.model == "smollm2"  # the one model served
    assert job.priority == "high"  # read before waiting generation jobs: it takes no slot
    assert (job.operation, job.content, job.add_special, job.parse_special, job.with_pieces) == \
        ("tokenize", "Hello world", False, True, False)
    assert reply.status_code == 200 and reply.json() == {"tokens": [19556, 905]}


async def test_tokenize_with_pieces_answers_ids_and_pieces(client: httpx.AsyncClient, worker: Any) -> None:
    pieces = [TokenPiece(id=1, piece="Hi"), TokenPiece(id=2, piece=[0xE2, 0x82])]
    job, reply = await _served(client, worker, "/tokenize", {"content": "Hi", "with_pieces": True,
                                                             "add_special": True, "parse_special": False},
                               tokens=[1, 2], pieces=pieces)
    assert (job.add_special, job.parse_special, job.with_pieces) == (True, False, True)
    assert reply.json() == {"tokens": [{"id": 1, "piece": "Hi"}, {"id": 2, "piece": [0xE2, 0x82]}]}


async def test_detokenize_and_apply_template(client: httpx.AsyncClient, worker: Any) -> None:
    job, reply = await _served(client, worker, "/detokenize", {"tokens": [19556, 905]}, text="Hello world")
    assert job.operation == "detokenize" and job.tokens == [19556, 905]
    assert reply.json() == {"content": "Hello world"}
    messages = [{"role": "user", "content": "Hi!"}]
    job, reply = await _served(client, worker, "/apply-template", {"messages": messages}, text="<prompt>")
    assert job.operation == "apply_template" and [m.content for m in job.messages or []] == ["Hi!"]
    assert reply.json() == {"prompt": "<prompt>"}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": [1, -2]}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/apply-template", {"messages": []}, "messages"),
    ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
])
async def test_bad_bodies_are_400s_naming_the_field(client: httpx.AsyncClient, worker: Any, path: str,
                                                     body: dict[str, Any], param: str) -> None:
    reply = await client.post(path, json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


async def test_an_unknown_model_is_a_404(client: httpx.AsyncClient, worker: Any) -> None:
    reply = await client.post("/tokenize", json={"model": "nope", "content": "x"})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


async def test_a_worker_error_reaches_the_client(client: httpx.AsyncClient, worker: Any) -> None:
    from shared.errors import NoChatTemplate

    task = asyncio.create_task(client.post("/apply-template", json={"messages": [{"role": "user", "content": "x"}]}))
    job = await worker.take()
    await worker.send(NoChatTemplate("no template", param="messages").to_event(job.id, worker.next_seq(job.id)))
    reply = await task
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "no_chat_template"
