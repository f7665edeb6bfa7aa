"""llama-server's tokenizer routes: /tokenize, /detokenize and /apply-template, answered by a worker of the model.

The gateway holds no tokenizer (it serves every model without loading one), so each call is a small TextJob on
the model's queue; the worker answers it at intake, without a batch slot, in one DoneEvent.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.cluster.broker import Broker
from gateway.http.fields import boolean, invalid, is_int, string
from gateway.replies.protocol import MAX_MODEL_NAME, parse_messages
from gateway.replies.request_events import RequestEvents
from gateway.replies.serving import new_request_id
from shared.errors import InternalError, InvalidRequest, LLMFleetError
from shared.messages import DoneEvent, ErrorEvent, TextJob
from shared.settings import Settings


def tokenize_job(body: dict[str, Any], settings: Settings, request_id: str, now: float) -> TextJob:
    """Validate a /tokenize body: content, add_special (false), parse_special (true), with_pieces (false)."""
    content = body.get("content")
    if content is None:
        raise InvalidRequest("Missing required parameter: 'content'.", param="content")
    if not isinstance(content, str):
        raise invalid("content", "expected a string.")
    if len(content) > settings.max_prompt_chars:
        raise invalid("content", f"longer than {settings.max_prompt_chars} characters.")
    return TextJob(**_base(body, settings, request_id, now), operation="tokenize", content=content,
                   add_special=boolean(body, "add_special", False), parse_special=boolean(body, "parse_special", True),
                   with_pieces=boolean(body, "with_pieces", False))


def detokenize_job(body: dict[str, Any], settings: Settings, request_id: str, now: float) -> TextJob:
    """Validate a /detokenize body: tokens, an array of token ids (may be empty)."""
    tokens = body.get("tokens")
    if tokens is None:
        raise InvalidRequest("Missing required parameter: 'tokens'.", param="tokens")
    if not isinstance(tokens, list) or not all(is_int(t) and t >= 0 for t in tokens):
        raise invalid("tokens", "expected an array of non-negative token ids.")
    if len(tokens) > settings.max_prompt_chars:
        raise invalid("tokens", f"more than {settings.max_prompt_chars} tokens.")
    return TextJob(**_base(body, settings, request_id, now), operation="detokenize", tokens=list(tokens))


def apply_template_job(body: dict[str, Any], settings: Settings, request_id: str, now: float) -> TextJob:
    """Validate an /apply-template body: chat messages, as /v1/chat/completions takes them."""
    return TextJob(**_base(body, settings, request_id, now), operation="apply_template",
                   messages=parse_messages(body.get("messages"), settings),
                   add_generation_prompt=boolean(body, "add_generation_prompt", True))


def _base(body: dict[str, Any], settings: Settings, request_id: str, now: float) -> dict[str, Any]:
    return {"id": request_id, "model": string(body, "model", max_len=MAX_MODEL_NAME), "created": now,
            "deadline": now + settings.request_timeout_s,
            "priority": "high"}  # answered at intake in no time: read before the generation jobs waiting


async def run_text_job(broker: Broker, job: TextJob) -> DoneEvent:
    """Queue a text job and wait for the worker's answer."""
    stream = await broker.submit(job)
    try:
        async for event in stream:
            if isinstance(event, ErrorEvent):
                raise LLMFleetError.from_event(event)
            if isinstance(event, DoneEvent):
                return event
        raise InternalError("the event stream ended without a terminal event")
    finally:
        await RequestEvents([stream], 1).close()


BUILDERS = {"tokenize": tokenize_job, "detokenize": detokenize_job, "apply_template": apply_template_job}


async def answer(broker: Broker, settings: Settings, operation: str, body: dict[str, Any]) -> dict[str, Any]:
    """The llama-server response body of one tokenizer route."""
    request_id, now = new_request_id(), time.time()
    done = await run_text_job(broker, BUILDERS[operation](body, settings, request_id, now))
    if operation == "tokenize":
        if done.pieces is not None:
            return {"tokens": [{"id": p.id, "piece": p.piece} for p in done.pieces]}
        return {"tokens": done.tokens or []}
    if operation == "detokenize":
        return {"content": done.text or ""}
    return {"prompt": done.text or ""}
