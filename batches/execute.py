"""Run one line of a batch through the normal job path, exactly as the gateway runs that request.

The body is validated by the gateway's own parsers and executed by gateway/replies/serving.py (same jobs, same
response bodies), with priority 'low' and never streamed. A line that is refused for a while (queue full,
no worker alive right now: 429 / 503) waits and tries again, until it runs or the runner gives up on it
(cancel, expiry, shutdown); any other error is that line's result and goes to the error file.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from batches import objects
from batches.input import BatchLine
from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.replies import protocol, serving
from shared.errors import InternalError, InvalidRequest, LLMFleetError
from shared.settings import Settings

log = logging.getLogger(__name__)

RETRY_STATUSES = (429, 503)
RETRY_MAX_S = 5.0


async def run_line(broker: Broker, registry: Registry, settings: Settings, line: BatchLine) -> tuple[bool, str]:
    """Execute one request; (ok, its output-file line or error-file line)."""
    line_id = f"batch_req_{secrets.token_hex(16)}"
    request_id = f"req_{secrets.token_hex(16)}"
    try:
        body = await _execute_with_retries(broker, registry, settings, line)
    except LLMFleetError as exc:
        log.info("batch line %d (%s) failed: %s %s", line.index, request_id, exc.status, exc.code)
        return False, objects.output_line(line_id, line.custom_id, request_id, exc.status, exc.to_openai())
    except Exception:  # a bug fails this line, not the batch
        log.exception("batch line %d (%s) broke", line.index, request_id)
        error = InternalError("The server had an error while processing your request.")
        return False, objects.output_line(line_id, line.custom_id, request_id, error.status, error.to_openai())
    return True, objects.output_line(line_id, line.custom_id, request_id, 200, body)


async def _execute_with_retries(broker: Broker, registry: Registry, settings: Settings,
                                line: BatchLine) -> dict[str, Any]:
    delay = 0.2
    while True:
        try:
            return await execute(broker, registry, settings, line)
        except LLMFleetError as exc:
            if exc.status not in RETRY_STATUSES:
                raise
            wait = min(RETRY_MAX_S, max(delay, exc.retry_after or 0.0))
            log.info("batch line %d: %s %s, retrying in %.1fs", line.index, exc.status, exc.code, wait)
            await asyncio.sleep(wait)
            delay = min(RETRY_MAX_S, delay * 2)


async def execute(broker: Broker, registry: Registry, settings: Settings, line: BatchLine) -> dict[str, Any]:
    """The response body of one line's request (raises its LLMFleetError)."""
    body = dict(line.body)
    body.pop("stream_options", None)
    body["stream"] = False
    body["priority"] = "low"
    if "model" not in body:  # as the routes do: the one model served, when there is exactly one
        live = sorted(await registry.live_models())
        if len(live) != 1:
            raise InvalidRequest("Missing required parameter: 'model'.", param="model")
        body["model"] = live[0]
    if line.url == "/v1/embeddings":
        return await serving.run_embeddings(broker, protocol.parse_embeddings(body, settings), settings)
    if line.url == "/v1/chat/completions":
        return await serving.run_completion(broker, registry, protocol.parse_chat(body, settings), settings)
    return await serving.run_completion(broker, registry, protocol.parse_completion(body, settings), settings)
