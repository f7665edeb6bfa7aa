"""The /v1/files and /v1/batches routes with the official `openai` client, against a real Redis (no worker:
what is checked here is the HTTP side; tests/integration/test_batches_api.py runs batches)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from batches.queue import batch_queue
from gateway.app import create_app
from gateway.http import api_keys
from shared import keys
from shared.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

MAX_FILE = 4096
LINE = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(redis_server: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    settings = Settings(redis_url=redis_server.url, max_file_bytes=MAX_FILE, max_batch_lines=5, max_body_bytes=2048)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", http_client=http, max_retries=0)


def jsonl(*items: dict[str, Any]) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


async def test_files_upload_list_retrieve_content_delete(client: openai.AsyncOpenAI) -> None:
    data = jsonl(LINE, {**LINE, "custom_id": "b"})
    made = await client.files.create(file=("in.jsonl", data), purpose="batch")
    assert made.id.startswith("file-") and made.bytes == len(data) and made.filename == "in.jsonl"
    assert made.purpose == "batch" and made.status == "processed"
    assert (await client.files.retrieve(made.id)).model_dump() == made.model_dump()
    assert (await client.files.content(made.id)).content == data
    listed = [f.id async for f in client.files.list(purpose="batch")]
    assert listed == [made.id]
    deleted = await client.files.delete(made.id)
    assert deleted.deleted and deleted.id == made.id
    with pytest.raises(openai.NotFoundError, match="No such File object"):
        await client.files.retrieve(made.id)


@pytest.mark.parametrize(("data", "purpose", "error", "words"), [
    (b"x" * (MAX_FILE + 1), "batch", openai.APIStatusError, "larger than the limit of 4096 bytes"),
    (jsonl(LINE), "fine-tune", openai.BadRequestError, "not supported"),
    (b"\xff\xfe", "batch", openai.BadRequestError, "UTF-8"),
    (jsonl(*({**LINE, "custom_id": str(i)} for i in range(6))), "batch", openai.BadRequestError, "at most 5"),
    (b"", "batch", openai.BadRequestError, "empty"),
])
async def test_bad_uploads_are_refused(client: openai.AsyncOpenAI, data: bytes, purpose: str, error: type,
                                       words: str) -> None:
    with pytest.raises(error, match=words) as caught:
        await client.files.create(file=("in.jsonl", data), purpose=purpose)  # type: ignore[arg-type]
    assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[union-attr]


async def test_an_upload_far_over_the_limit_is_a_413_before_it_is_read(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        await client.files.create(file=("big.jsonl", b"x" * (MAX_FILE + 200_000)), purpose="batch")
    assert caught.value.status_code == 413


async def test_create_retrieve_list_cancel_a_batch(client: openai.AsyncOpenAI, redis_server: Any) -> None:
    file_id = (await client.files.create(file=("in.jsonl", jsonl(LINE, {**LINE, "custom_id": "b"})),
                                         purpose="batch")).id
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h", metadata={"team": "a"})
    assert batch.status == "validating" and batch.request_counts.total == 2 and batch.metadata == {"team": "a"}
    assert batch.input_file_id == file_id and batch.endpoint == "/v1/chat/completions"
    sync = redis.Redis.from_url(redis_server.url)
    job = batch_queue(sync).fetch_job(sync.hget(keys.batch_key(batch.id), "rq_job").decode())
    assert job is not None and job.args == [batch.id] and job.func_name == "batches.runner.run_batch"
    sync.close()
    assert (await client.batches.retrieve(batch.id)).model_dump() == batch.model_dump()
    second = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
    page = await client.batches.list(limit=1)
    assert [b.id for b in page.data] == [second.id] and page.has_more
    assert [b.id for b in (await client.batches.list(limit=5, after=second.id)).data] == [batch.id]
    cancelled = await client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at is not None
    with pytest.raises(openai.NotFoundError, match="No such Batch object"):
        await client.batches.retrieve("batch_missing")


@pytest.mark.parametrize(("lines", "args", "error", "words"), [
    ([LINE, {**LINE, "url": "/v1/images"}], {}, openai.BadRequestError, "Line 2 of the input file: url must be"),
    ([LINE, LINE], {}, openai.BadRequestError, "Line 2 of the input file: the custom_id 'a' is used"),
    ([{**LINE, "body": {"model": "m", "prompt": "x" * 3000}}], {}, openai.BadRequestError, "larger than the limit"),
    ([LINE], {"endpoint": "/v1/responses"}, openai.BadRequestError, "endpoint"),
    ([LINE], {"completion_window": "1h"}, openai.BadRequestError, "24h"),
    ([LINE], {"input_file_id": "file-missing"}, openai.NotFoundError, "No such File object: file-missing"),
    ([LINE], {"metadata": {"k": "v" * 600}}, openai.BadRequestError, "metadata"),
])
async def test_bad_batches_are_refused_naming_the_problem(client: openai.AsyncOpenAI, redis_server: Any,
                                                          lines: list, args: dict, error: type, words: str) -> None:
    file_id = (await client.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")).id
    create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **args}
    with pytest.raises(error, match=words):
        await client.batches.create(**create)
    sync = redis.Redis.from_url(redis_server.url)
    assert sync.zcard(keys.BATCHES_INDEX) == 0 and sync.llen(f"rq:queue:{keys.BATCH_QUEUE}") == 0
    sync.close()


async def test_with_api_keys_each_key_sees_only_its_own_files_and_batches(redis_server: Any, tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    alice, bob = api_keys.add(path, "alice"), api_keys.add(path, "bob")
    app = create_app(Settings(redis_url=redis_server.url, keys_file=str(path)))
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
        def client(key: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key=key, http_client=http, max_retries=0)

        mine, theirs = client(alice), client(bob)
        file_id = (await mine.files.create(file=("in.jsonl", jsonl(LINE)), purpose="batch")).id
        batch = await mine.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
        assert [f.id async for f in mine.files.list()] == [file_id]
        assert [b.id async for b in mine.batches.list()] == [batch.id]
        assert [f.id async for f in theirs.files.list()] == [] and [b.id async for b in theirs.batches.list()] == []
        for call in (theirs.files.retrieve(file_id), theirs.files.content(file_id), theirs.files.delete(file_id),
                     theirs.batches.retrieve(batch.id), theirs.batches.cancel(batch.id),
                     theirs.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                           completion_window="24h")):
            with pytest.raises(openai.NotFoundError):
                await call
        assert (await mine.batches.retrieve(batch.id)).status == "validating"  # bob's cancel did nothing
        assert (await mine.files.content(file_id)).content == jsonl(LINE)
