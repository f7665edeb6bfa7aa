"""Batches and files in a real Redis: OpenAI's shapes, status changes, results counted once, files in order."""

from __future__ import annotations

import json

import openai.types
import pytest
from redis.asyncio import Redis

from batches.files import FileStore
from batches.store import BatchStore
from shared import keys
from shared.errors import InvalidRequest, NotFound

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def new_batch(store: BatchStore, total: int = 3, **overrides: object) -> dict:
    args = {"input_file_id": "file-in", "endpoint": "/v1/chat/completions", "completion_window": "24h",
            "metadata": {"k": "v"}, "total": total, **overrides}
    return await store.create(**args)  # type: ignore[arg-type]


async def test_a_new_batch_is_an_openai_batch_object(aredis: Redis) -> None:
    store = BatchStore(aredis)
    batch = await new_batch(store)
    parsed = openai.types.Batch.model_validate(batch)
    assert parsed.status == "validating" and parsed.id.startswith("batch_") and parsed.metadata == {"k": "v"}
    assert parsed.request_counts.model_dump() == {"total": 3, "completed": 0, "failed": 0}
    assert parsed.expires_at == parsed.created_at + 24 * 3600 and parsed.in_progress_at is None
    assert set(batch) >= {"errors", "output_file_id", "error_file_id", "cancelling_at", "failed_at", "expired_at"}
    assert await store.get(batch["id"]) == batch
    assert await aredis.sismember(keys.BATCHES_ACTIVE, batch["id"])
    with pytest.raises(NotFound, match="No such Batch object: batch_nope"):
        await store.get("batch_nope")


async def test_status_moves_only_from_the_statuses_named(aredis: Redis) -> None:
    store = BatchStore(aredis)
    batch_id = (await new_batch(store))["id"]
    assert await store.transition(batch_id, "finalizing", allowed_from=("in_progress",)) == "validating"
    assert await store.transition(batch_id, "in_progress", allowed_from=("validating",)) is None
    batch = await store.get(batch_id)
    assert batch["status"] == "in_progress" and batch["in_progress_at"] >= batch["created_at"]
    cancelled = await store.cancel(batch_id)
    assert cancelled["status"] == "cancelling" and cancelled["cancelling_at"] is not None
    assert (await store.cancel(batch_id))["status"] == "cancelling"  # again: no change, no error
    done = await store.finish(batch_id, "cancelled")
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None
    assert (await store.cancel(batch_id))["status"] == "cancelled"  # already cancelled: returned as it is
    completed = await new_batch(store)
    await store.finish(completed["id"], "completed")
    with pytest.raises(InvalidRequest, match="Cannot cancel a batch with status 'completed'"):
        await store.cancel(completed["id"])


async def test_a_line_counts_once_and_the_files_keep_input_order(aredis: Redis) -> None:
    store, files = BatchStore(aredis), FileStore(aredis)
    batch_id = (await new_batch(store, total=12))["id"]
    for index in (10, 2, 0, 11):
        assert await store.record(batch_id, index, True, json.dumps({"custom_id": f"c{index}"}))
    assert await store.record(batch_id, 5, False, json.dumps({"custom_id": "c5"}))
    assert not await store.record(batch_id, 2, False, "a repeat of line 2 after a resumed run")
    assert not await store.record(batch_id, 5, True, "a repeat of line 5")
    assert await store.done_lines(batch_id) == {0, 2, 5, 10, 11}
    counts = (await store.get(batch_id))["request_counts"]
    assert counts == {"total": 12, "completed": 4, "failed": 1}

    done = await store.finish(batch_id, "completed")
    output = (await files.content(done["output_file_id"])).decode().splitlines()
    assert [json.loads(line)["custom_id"] for line in output] == ["c0", "c2", "c10", "c11"]
    assert [json.loads(line)["custom_id"] for line in
            (await files.content(done["error_file_id"])).decode().splitlines()] == ["c5"]
    meta = openai.types.FileObject.model_validate(await files.get(done["output_file_id"]))
    assert meta.purpose == "batch_output" and meta.filename == f"{batch_id}_output.jsonl"
    assert not await aredis.exists(keys.batch_output(batch_id), keys.batch_errors(batch_id))
    assert not await aredis.sismember(keys.BATCHES_ACTIVE, batch_id)


async def test_no_error_file_when_nothing_failed(aredis: Redis) -> None:
    store = BatchStore(aredis)
    batch_id = (await new_batch(store, total=1))["id"]
    await store.record(batch_id, 0, True, "{}")
    done = await store.finish(batch_id, "completed")
    assert done["output_file_id"] and done["error_file_id"] is None


async def test_batches_list_newest_first_with_a_cursor(aredis: Redis) -> None:
    store = BatchStore(aredis)
    ids = [(await new_batch(store))["id"] for _ in range(3)]
    first = await store.list(limit=2, after=None)
    assert [b["id"] for b in first["data"]] == ids[::-1][:2] and first["has_more"]
    assert first["first_id"] == ids[2] and first["last_id"] == ids[1]
    rest = await store.list(limit=2, after=first["last_id"])
    assert [b["id"] for b in rest["data"]] == [ids[0]] and not rest["has_more"]
    with pytest.raises(InvalidRequest):
        await store.list(limit=101, after=None)
    with pytest.raises(NotFound):
        await store.list(limit=2, after="batch_unknown")


async def test_files_create_read_list_delete(aredis: Redis) -> None:
    files = FileStore(aredis)
    made = [await files.create(f"f{i}.jsonl", "batch", f"data {i}\n".encode()) for i in range(3)]
    assert openai.types.FileObject.model_validate(made[0]).bytes == len(b"data 0\n")
    assert await files.content(made[1]["id"]) == b"data 1\n"
    assert await files.get(made[2]["id"]) == made[2]
    page = await files.list(purpose="batch", limit=2, after=None, order="desc")
    assert [f["id"] for f in page["data"]] == [made[2]["id"], made[1]["id"]] and page["has_more"]
    page = await files.list(purpose=None, limit=5, after=made[0]["id"], order="asc")
    assert [f["id"] for f in page["data"]] == [made[1]["id"], made[2]["id"]] and not page["has_more"]
    assert (await files.list(purpose="batch_output", limit=5, after=None, order="desc"))["data"] == []
    assert await files.delete(made[0]["id"]) == {"id": made[0]["id"], "object": "file", "deleted": True}
    for call in (files.get, files.content, files.delete):
        with pytest.raises(NotFound, match="No such File object"):
            await call(made[0]["id"])


async def test_a_batch_and_its_files_belong_to_the_key_that_made_it(aredis: Redis) -> None:
    store, files = BatchStore(aredis), FileStore(aredis)
    batch_id = (await new_batch(store, total=1, owner="alice"))["id"]
    assert (await store.get(batch_id, "alice"))["id"] == batch_id and await store.get(batch_id)  # None: the runner
    with pytest.raises(NotFound):
        await store.get(batch_id, "bob")
    assert (await store.list(limit=5, after=None, owner="bob"))["data"] == []
    await store.record(batch_id, 0, True, "{}")
    output_id = (await store.finish(batch_id, "completed"))["output_file_id"]
    assert await files.content(output_id, "alice") == b"{}\n"
    with pytest.raises(NotFound):
        await files.content(output_id, "bob")
