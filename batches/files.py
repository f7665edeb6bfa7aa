"""Files (/v1/files) kept in Redis, so every gateway and batch runner on any host sees the same ones.

A file is one hash: its metadata and its bytes (`data`), bounded by LLMFLEET_MAX_FILE_BYTES; an index
sorted by creation time serves the listing. Files stay until they are deleted.
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from batches import objects
from shared import keys
from shared.errors import InvalidRequest, NotFound

META_FIELDS = ("id", "filename", "purpose", "bytes", "created_at")
MAX_FILENAME = 256
MAX_LIST_LIMIT = 10_000


def file_not_found(file_id: str, param: str | None = None) -> NotFound:
    """OpenAI's 404 for an unknown file id."""
    return NotFound(f"No such File object: {file_id}", param=param)


def queue_file(pipe: Pipeline, file_id: str, filename: str, purpose: str, data: bytes, now: float) -> dict[str, str]:
    """Add the commands that store one file to `pipe` (so a batch can write its files atomically)."""
    fields = {"id": file_id, "filename": filename[:MAX_FILENAME], "purpose": purpose, "bytes": str(len(data)),
              "created_at": repr(now)}
    pipe.hset(keys.file_key(file_id), mapping={**fields, "data": data})
    pipe.zadd(keys.FILES_INDEX, {file_id: now})
    return fields


class FileStore:
    """Create, read, list and delete files in Redis."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def create(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        """Store a new file; returns its file object."""
        pipe = self.redis.pipeline(transaction=True)
        fields = queue_file(pipe, objects.new_file_id(), filename, purpose, data, time.time())
        await pipe.execute()
        return objects.file_object(fields)

    async def get(self, file_id: str) -> dict[str, Any]:
        """The file object of `file_id` (404 if there is none)."""
        values = await self.redis.hmget(keys.file_key(file_id), META_FIELDS)
        if values[0] is None:
            raise file_not_found(file_id)
        return objects.file_object(objects.decode_hash(dict(zip(META_FIELDS, values, strict=True))))

    async def content(self, file_id: str) -> bytes:
        """The bytes of `file_id` (404 if there is none)."""
        data = await self.redis.hget(keys.file_key(file_id), "data")
        if data is None:
            raise file_not_found(file_id)
        return bytes(data)

    async def delete(self, file_id: str) -> dict[str, Any]:
        """Delete `file_id` (404 if there is none); OpenAI's deletion object."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.file_key(file_id))
        pipe.zrem(keys.FILES_INDEX, file_id)
        deleted, _ = await pipe.execute()
        if not deleted:
            raise file_not_found(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def list(self, *, purpose: str | None, limit: int, after: str | None, order: str) -> dict[str, Any]:
        """A page of file objects, newest first unless order is 'asc', starting after the id `after`."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIST_LIMIT}", param="limit")
        ids = [objects._text(i) for i in await self.redis.zrange(keys.FILES_INDEX, 0, -1, desc=order != "asc")]
        if after is not None:
            if after not in ids:
                raise InvalidRequest(f"No such File object: {after}", param="after")
            ids = ids[ids.index(after) + 1:]
        page: list[dict[str, Any]] = []
        for file_id in ids:
            if len(page) > limit:
                break
            try:
                item = await self.get(file_id)
            except NotFound:  # deleted meanwhile
                continue
            if purpose is None or item["purpose"] == purpose:
                page.append(item)
        return objects.list_page(page[:limit], has_more=len(page) > limit)
