"""Stored responses in Redis (`llmfleet:response:{id}`, one JSON string, EX LLMFLEET_RESPONSES_TTL_S), so any
gateway answers GET / DELETE / cancel and continues any conversation (previous_response_id).

A record holds the response object, the items the model read before it (`history`: every earlier input and
output item of the chain, then this request's input; instructions are not items), the request id and model
of its job (for cancel), the API key that made it (another key gets a 404, as if it did not exist) and the
job's deadline. A record still `in_progress` past its deadline (the gateway that ran it died) reads as failed.
Redis errors are a 503 (Unavailable); a record that is gone (expired, deleted, Redis restarted empty) is a 404.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio import Redis

from gateway.http.redis_errors import redis_unavailable
from shared import keys
from shared.errors import PreviousResponseNotFound, ResponseNotFound
from shared.settings import Settings

log = logging.getLogger(__name__)

RUNNING = ("queued", "in_progress")
ORPHAN_MARGIN_S = 30.0  # past the deadline and the grace: the gateway that ran it is gone


@dataclass(frozen=True)
class StoredResponse:
    """One stored response and what it continues from."""

    response: dict[str, Any]
    history: list[dict[str, Any]]
    request_id: str
    model: str
    key: str | None
    deadline: float

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The items a response continuing this one reads first: history, then this one's output."""
        return [*self.history, *(_as_input(item) for item in self.response["output"])]


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the canonical input item it becomes in a continuation (with its id)."""
    if item["type"] == "reasoning":
        return {"id": item["id"], "type": "reasoning", "summary": [], "content": item["content"]}
    if item["type"] == "message":
        return {"id": item["id"], "type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": part["text"]} for part in item["content"]]}
    return {"id": item["id"], "type": "function_call", "call_id": item["call_id"], "name": item["name"],
            "arguments": item["arguments"]}


class ResponseStore:
    """Read and write stored responses."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings

    async def save(self, record: StoredResponse) -> None:
        """Write (or overwrite) a record with a fresh TTL; Redis errors are a 503."""
        data = json.dumps(asdict(record), separators=(",", ":"), ensure_ascii=False)
        with redis_unavailable(self._settings.retry_after_s):
            await self._redis.set(keys.response_key(record.response["id"]), data,
                                  ex=int(self._settings.responses_ttl_s))

    async def save_quietly(self, record: StoredResponse) -> bool:
        """save(), but a failure is logged instead of raised (the reply already went out)."""
        try:
            await self.save(record)
        except Exception as exc:  # noqa: BLE001 - never fail a finished request over its copy
            log.warning("could not store response %s: %s", record.response["id"], type(exc).__name__)
            return False
        return True

    async def load(self, rid: str, key: str | None, *, previous: bool = False) -> StoredResponse:
        """The record of `rid` as `key` may see it; ResponseNotFound (404) when there is none."""
        with redis_unavailable(self._settings.retry_after_s):
            raw = await self._redis.get(keys.response_key(rid))
        record = _decode(raw) if raw is not None else None
        if record is None or record.key != key:
            if previous:
                raise PreviousResponseNotFound(f"Previous response with id '{rid}' not found.",
                                               param="previous_response_id")
            raise ResponseNotFound(f"Response with id '{rid}' not found.")
        return self._orphan_checked(record)

    async def mark_cancelled(self, rid: str) -> None:
        """A running record becomes `cancelled` (its job was cancelled: nobody resumed its stream); never raises."""
        try:
            raw = await self._redis.get(keys.response_key(rid))
            record = _decode(raw) if raw is not None else None
            if record is not None and record.response["status"] in RUNNING:
                await self.save(StoredResponse(**{**asdict(record), "response": {**record.response,
                                                                                  "status": "cancelled"}}))
        except Exception as exc:  # noqa: BLE001 - the cancel went out; the record reads failed past its deadline
            log.warning("could not mark response %s cancelled: %s", rid, type(exc).__name__)

    async def delete(self, rid: str, key: str | None) -> None:
        """Delete a record; ResponseNotFound when there is none for this key."""
        await self.load(rid, key)
        with redis_unavailable(self._settings.retry_after_s):
            await self._redis.delete(keys.response_key(rid))

    def _orphan_checked(self, record: StoredResponse) -> StoredResponse:
        """A running record past its deadline reads as failed: the gateway that ran it stopped."""
        limit = record.deadline + self._settings.deadline_grace_s + ORPHAN_MARGIN_S
        if record.response["status"] not in RUNNING or time.time() < limit:
            return record
        response = {**record.response, "status": "failed",
                    "error": {"code": "server_error", "message": "The gateway running this response stopped."}}
        return StoredResponse(**{**asdict(record), "response": response})


def _decode(raw: bytes) -> StoredResponse | None:
    try:
        return StoredResponse(**json.loads(raw))
    except (ValueError, TypeError):
        log.warning("an unreadable stored response was ignored")
        return None
