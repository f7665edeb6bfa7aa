"""Files (/v1/files) kept in Redis, so every gateway and batch runner on any host sees the same ones.

A file is one hash: its metadata and its bytes (`data`), bounded by LLMFLEET_MAX_FILE_BYTES; an index
sorted by creation time serves the listing. Files stay until they are deleted. A file belongs to the API
key that made it (`owner`, the key's name; "" without keys): a reader passing `owner` sees only its own
files, another key's are a 404 as if they did not exist; owner None (the batch runner) sees every file.
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from batches import objects
from shared import keys
from shared.errors import InvalidRequest, NotFound
from shared.redis_commands import reply_text

META_FIELDS = ("id", "filename", "purpose", "bytes", "created_at", "owner")
MAX_FILENAME = 256
MAX_LIST_LIMIT = 10_000


def file_not_found(file_id: str, param: str | None = None) -> NotFound:
    """OpenAI's 404 for an unknown file id."""
    return NotFound(f"No such File object: {file_id}", param=param)


def queue_file(pipe: Pipeline, file_id: str, filename: str, purpose: str, data: bytes, now: float,
               owner: str = "") -> dict[str, str]:
    """Add the commands that store one file to `pipe` (so a batch can write its files atomically)."""
    fields = {"id": file_id, "filename": filename[:MAX_FILENAME], "purpose": purpose, "bytes": str(len(data)),
              "created_at": repr(now), "owner": owner}
    pipe.hset(keys.file_key(file_id), mapping={**fields, "data": data})
    pipe.zadd(keys.FILES_INDEX, {file_id: now})
    return fields


class FileStore:
    """Create, read, list and delete files in Redis."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def create(self, filename: str, purpose: str, data: bytes, owner: str = "") -> dict[str, Any]:
        """Store a new file; returns its file object."""
        pipe = self.redis.pipeline(transaction=True)
        fields = queue_file(pipe, objects.new_file_id(), filename, purpose, data, time.time(), owner)
        await pipe.execute()
        return objects.file_object(fields)

    async def get(self, file_id: str, owner: str | None = None) -> dict[str, Any]:
        """The file object of `file_id` (404 if there is none, or it is not `owner`'s)."""
        values = await self.redis.hmget(keys.file_key(file_id), META_FIELDS)
        fields = objects.decode_hash({k: v for k, v in zip(META_FIELDS, values, strict=True) if v is not None})
        if "id" not in fields or not visible_to(fields, owner):
            raise file_not_found(file_id)
        return objects.file_object(fields)

    async def content(self, file_id: str, owner: str | None = None) -> bytes:
        """The bytes of `file_id` (404 if there is none, or it is not `owner`'s)."""
        stored_owner, data = await self.redis.hmget(keys.file_key(file_id), ["owner", "data"])
        if data is None or not visible_to({"owner": reply_text(stored_owner or b"")}, owner):
            raise file_not_found(file_id)
        return bytes(data)

    async def delete(self, file_id: str, owner: str | None = None) -> dict[str, Any]:
        """Delete `file_id` (404 if there is none, or it is not `owner`'s); OpenAI's deletion object."""
        await self.get(file_id, owner)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.file_key(file_id))
        pipe.zrem(keys.FILES_INDEX, file_id)
        deleted, _ = await pipe.execute()
        if not deleted:
            raise file_not_found(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def list(self, *, purpose: str | None, limit: int, after: str | None, order: str,
                   owner: str | None = None) -> dict[str, Any]:
        """A page of file objects, newest first unless order is 'asc', starting after the id `after`."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIST_LIMIT}", param="limit")
        ids = [reply_text(i) for i in await self.redis.zrange(keys.FILES_INDEX, 0, -1, desc=order != "asc")]
        if after is not None:
            if after not in ids:
                raise InvalidRequest(f"No such File object: {after}", param="after")
            ids = ids[ids.index(after) + 1:]
        page: list[dict[str, Any]] = []
        for file_id in ids:
            if len(page) > limit:
                break
            try:
                item = await self.get(file_id, owner)
            except NotFound:  # deleted meanwhile, or another key's
                continue
            if purpose is None or item["purpose"] == purpose:
                page.append(item)
        return objects.list_page(page[:limit], has_more=len(page) > limit)


def visible_to(fields: dict[str, str], owner: str | None) -> bool:
    """Whether a reader acting for `owner` (None: anyone) may see a stored object."""
    return owner is None or fields.get("owner", "") == owner
