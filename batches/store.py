"""Batches in Redis: their fields, status changes, per-line results and the writing of their files.

Every status change is one Lua script (TRANSITION) that applies only from the statuses it names, so a
cancel and a runner never both win; a line's result is recorded once (RECORD: the first result of a line
counts, a repeat after a resumed run is ignored), and its count goes up in the same script.
"""

from __future__ import annotations

import json
import time
from typing import Any

from redis.asyncio import Redis

from batches import objects
from batches.files import queue_file, visible_to
from shared import keys
from shared.errors import InvalidRequest, NotFound
from shared.redis_commands import reply_text

MAX_LIST_LIMIT = 100
LIST_SCAN = 200  # batch ids read from the index per round while filling a page

TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
for i = 3, #ARGV do
  if ARGV[i] == status then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])
    return 1
  end
end
return status
"""

RECORD = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return 0
end
if ARGV[2] == 'completed' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
else
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
end
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
return 1
"""


def batch_not_found(batch_id: str) -> NotFound:
    """OpenAI's 404 for an unknown batch id."""
    return NotFound(f"No such Batch object: {batch_id}", param="batch_id")


class BatchStore:
    """Create, read, list, move and finish batches in Redis."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._transition = redis.register_script(TRANSITION)
        self._record = redis.register_script(RECORD)

    async def create(self, *, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None, total: int, owner: str = "") -> dict[str, Any]:
        """Store a new batch in status 'validating'; returns its batch object."""
        now = time.time()
        batch_id = objects.new_batch_id()
        fields = {"id": batch_id, "endpoint": endpoint, "input_file_id": input_file_id,
                  "completion_window": completion_window, "status": "validating", "created_at": repr(now),
                  "expires_at": repr(now + objects.COMPLETION_WINDOW_S[completion_window]),
                  "total": str(total), "completed": "0", "failed": "0", "attempts": "0",
                  "metadata": json.dumps(metadata) if metadata is not None else "", "owner": owner}
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.batch_key(batch_id), mapping=fields)
        pipe.zadd(keys.BATCHES_INDEX, {batch_id: now})
        pipe.sadd(keys.BATCHES_ACTIVE, batch_id)
        await pipe.execute()
        return objects.batch_object(fields)

    async def fields(self, batch_id: str, owner: str | None = None) -> dict[str, str]:
        """The stored fields of `batch_id` (404 if there is none, or it is not `owner`'s; None: anyone's)."""
        raw = await self.redis.hgetall(keys.batch_key(batch_id))
        fields = objects.decode_hash(raw)
        if not raw or not visible_to(fields, owner):
            raise batch_not_found(batch_id)
        return fields

    async def get(self, batch_id: str, owner: str | None = None) -> dict[str, Any]:
        """The batch object of `batch_id`."""
        return objects.batch_object(await self.fields(batch_id, owner))

    async def list(self, *, limit: int, after: str | None, owner: str | None = None) -> dict[str, Any]:
        """A page of `owner`'s batch objects (None: everyone's), newest first, starting after the id `after`."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIST_LIMIT}", param="limit")
        start = 0
        if after is not None:
            rank = await self.redis.zrevrank(keys.BATCHES_INDEX, after)
            if rank is None:
                raise batch_not_found(after)
            start = rank + 1
        page: list[dict[str, Any]] = []
        while len(page) <= limit:
            ids = await self.redis.zrevrange(keys.BATCHES_INDEX, start, start + LIST_SCAN - 1)
            start += LIST_SCAN
            for batch_id in ids:
                fields = objects.decode_hash(await self.redis.hgetall(keys.batch_key(reply_text(batch_id))))
                if fields and visible_to(fields, owner):
                    page.append(objects.batch_object(fields))
            if len(ids) < LIST_SCAN:
                break
        return objects.list_page(page[:limit], has_more=len(page) > limit)

    async def transition(self, batch_id: str, to: str, *, allowed_from: tuple[str, ...]) -> str | None:
        """Move the batch to status `to` (stamping `{to}_at`) if it is in one of `allowed_from`.

        Returns None when it moved, else the status it is in (so the caller knows why it did not).
        """
        result = await self._transition(keys=[keys.batch_key(batch_id)],
                                        args=[to, repr(time.time()), *allowed_from])
        if result == 1:
            return None
        if result is None:
            raise batch_not_found(batch_id)
        return reply_text(result)

    async def cancel(self, batch_id: str, owner: str | None = None) -> dict[str, Any]:
        """Ask for the batch to be cancelled: 'cancelling' now, 'cancelled' once its runner stopped."""
        await self.fields(batch_id, owner)
        status = await self.transition(batch_id, "cancelling", allowed_from=("validating", "in_progress"))
        if status is not None and status not in ("cancelling", "cancelled"):
            raise InvalidRequest(f"Cannot cancel a batch with status '{status}'.", param="batch_id")
        return await self.get(batch_id)

    async def record(self, batch_id: str, index: int, ok: bool, line: str) -> bool:
        """Keep the result of line `index` and count it (completed or failed); False if it had one already."""
        done = await self._record(keys=[keys.batch_key(batch_id), keys.batch_output(batch_id),
                                        keys.batch_errors(batch_id)],
                                  args=[str(index), "completed" if ok else "failed", line])
        return bool(done)

    async def done_lines(self, batch_id: str) -> set[int]:
        """The indexes of the lines that already have a result."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hkeys(keys.batch_output(batch_id))
        pipe.hkeys(keys.batch_errors(batch_id))
        output, errors = await pipe.execute()
        return {int(i) for i in [*output, *errors]}

    async def set_field(self, batch_id: str, name: str, value: str) -> None:
        """Set one stored field of the batch."""
        await self.redis.hset(keys.batch_key(batch_id), name, value)

    async def finish(self, batch_id: str, status: str, *, errors: str | None = None) -> dict[str, Any]:
        """Write the output and error files from the recorded lines (in input order) and end the batch."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.batch_output(batch_id))
        pipe.hgetall(keys.batch_errors(batch_id))
        pipe.hget(keys.batch_key(batch_id), "owner")
        output, failed, owner = await pipe.execute()
        now = time.time()
        suffix = batch_id.removeprefix("batch_")
        fields: dict[str, str] = {"status": status, f"{status}_at": repr(now)}
        pipe = self.redis.pipeline(transaction=True)
        for kind, lines in (("output", output), ("error", failed)):
            if lines:
                data = "".join(reply_text(lines[i]) + "\n" for i in sorted(lines, key=int)).encode()
                file_id = f"file-{suffix}-{kind}"  # the same id if a resumed runner writes it again
                queue_file(pipe, file_id, f"{batch_id}_{kind}.jsonl", "batch_output", data, now,
                           reply_text(owner or b""))
                fields[f"{kind}_file_id"] = file_id
        if errors is not None:
            fields["errors"] = errors
        pipe.hset(keys.batch_key(batch_id), mapping=fields)
        pipe.srem(keys.BATCHES_ACTIVE, batch_id)
        pipe.delete(keys.batch_output(batch_id), keys.batch_errors(batch_id))
        await pipe.execute()
        return await self.get(batch_id)
