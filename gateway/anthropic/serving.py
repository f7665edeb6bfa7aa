"""Anthropic Messages API responses: one message body, the named SSE event stream, and count_tokens.

RequestEvents goes through gateway/replies/serving.py like every chat request (the same admission, deadlines, metrics,
rate-limit charges and cancellation on disconnect); this module only shapes what comes back:
- a message {id "msg_...", type, role, model, content [text, tool_use {id "toolu_...", name, input}],
  stop_reason end_turn | max_tokens | stop_sequence | tool_use, stop_sequence, usage};
- a stream: message_start, then per content block content_block_start, content_block_delta (text_delta or
  input_json_delta) ..., content_block_stop, with one ping after the first block starts; then message_delta
  (stop_reason, stop_sequence, usage) and message_stop. A failure after the stream began is an `event: error`.
  message_start cannot know the prompt's token count yet (workers report usage at the end), so it says 0 and
  message_delta carries the input counts too; the SDK's accumulated message takes them from there. A request still
  queued after a moment gets its stream at once, as chat completions do: `: queued` and keep-alive comments
  (which clients ignore) until the job starts, then the events; a failure from then on is an `event: error`.
- count_tokens: a job with max_tokens 0, which the worker renders and tokenizes without running the model.
Explicit prompt caching (cache_control) is not implemented; cache_read_input_tokens counts the prompt tokens
the workers' automatic prefix cache served.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.anthropic.errors import error_body
from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.http.error_log import ErrorLog, note_request
from gateway.http.sse import Comment
from gateway.replies import serving
from gateway.replies.bodies import ChoiceResult
from gateway.replies.parser import Part, ReplyParser, needs_parsing
from gateway.replies.protocol import ChatRequest
from gateway.replies.reasoning import Reasoning
from gateway.replies.request_events import STILL_WAITING, RequestEvents
from gateway.replies.streaming import OpenStream, queued_comments, record_streamed_error
from gateway.replies.tool_calls import ArgumentsDelta, CallStart
from shared.errors import InternalError, LLMFleetError
from shared.messages import DoneEvent, ErrorEvent, TokenEvent, Usage
from shared.settings import Settings

log = logging.getLogger(__name__)


def message_id(request_id: str) -> str:
    """The message id of a request: 'msg_' and its hex digits."""
    return "msg_" + request_id.removeprefix("req-")


def tool_use_id(call_id: str) -> str:
    """Anthropic's id of a tool call the gateway parsed out ('call_...' -> 'toolu_...')."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish_reason: str | None, stop_sequence: str | None, made_calls: bool) -> str:
    """Anthropic's stop_reason for how a choice ended (a tool turn cut only in a further call has finish_reason
    "tool_calls", so it is tool_use)."""
    if finish_reason == "length":
        return "max_tokens"
    if made_calls:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage_body(usage: Usage, dropped_tool_calls: int = 0) -> dict[str, int]:
    """Anthropic's usage object: as in Anthropic's (and llama-server's) accounting, input_tokens are the prompt
    tokens the worker computed and cache_read_input_tokens those its prefix cache served; nothing is billed for
    writing to that cache (it is automatic), so cache_creation_input_tokens is 0. llmfleet's dropped_tool_calls
    counts a tool_use cut short by max_tokens and left out (only when there was one)."""
    body = {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens, "output_tokens": usage.completion_tokens}
    if dropped_tool_calls:
        body["dropped_tool_calls"] = dropped_tool_calls
    return body


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool_use block's input: the call's arguments object ({} when they were cut short by max_tokens)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message_body(response_id: str, model: str, choice: ChoiceResult, usage: Usage) -> dict[str, Any]:
    """A whole message, from a finished choice."""
    content: list[dict[str, Any]] = []
    if choice.reasoning:  # a thinking block first, as Anthropic's extended thinking (unsigned: no signature)
        content.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.text:
        content.append({"type": "text", "text": choice.text})
    for call in choice.tool_calls or []:
        content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["name"],
                        "input": tool_input(call["arguments"])})
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.finish_reason, choice.stop_sequence, bool(choice.tool_calls)),
        "stop_sequence": choice.stop_sequence,
        "usage": usage_body(usage, choice.dropped_calls),
    }


async def create_message(broker: Broker, registry: Registry, request: ChatRequest,
                         settings: Settings) -> dict[str, Any]:
    """Run a request to the end and answer with one message."""
    done = await serving.collect_completion(broker, registry, request, settings)
    return message_body(message_id(done.request_id), request.params.model, done.choices[0], done.usage)


async def stream_message(broker: Broker, registry: Registry, request: ChatRequest, settings: Settings,
                         body: dict[str, Any] | None = None) -> MessageStream:
    """Start a request and wait a moment for its first event (errors until then are raised); then stream it.
    With the request's `body` it is resumable (GET /v1/messages/{id}/stream)."""
    request_id = serving.new_request_id()
    started = await serving.start_stream(broker, registry, request, settings, request_id=request_id,
                                         resumable=("anthropic", message_id(request_id), body) if body else None)
    stream = message_stream(broker, request, settings, started.request_events, request_id, started.reply_format,
                            started.priming)
    stream.resumable(broker.streams, started.stream_id)
    return stream


def message_stream(broker: Broker, request: ChatRequest, settings: Settings, request_events: RequestEvents, request_id: str,
                   reply_format: str, priming: asyncio.Task[None] | None = None) -> MessageStream:
    """The named events of a request's events (a new request, or a resumed one from its journal's start)."""
    return MessageStream(request_events, message_id(request_id), request.params.model, tools=request.tools.active,
                         reasoning=request.reasoning, priming=priming, reply_format=reply_format,
                         keepalive_s=settings.sse_keepalive_s, errors=broker.errors)


async def count_tokens(broker: Broker, request: ChatRequest, settings: Settings) -> dict[str, int]:
    """The prompt's token count as the model's worker renders it (system, messages and tools)."""
    request_id, now = serving.new_request_id(), time.time()
    (job,) = serving.build_jobs(request, settings, request_id, now)
    stream = await broker.submit(job)
    note_request().request_id = request_id  # queued: from here on the id is in the logs
    try:
        async for event in stream:
            if isinstance(event, ErrorEvent):
                raise LLMFleetError.from_event(event)
            if isinstance(event, DoneEvent):
                return {"input_tokens": event.usage.prompt_tokens}
        raise InternalError("the event stream ended without a terminal event")
    finally:
        await RequestEvents([stream], 1).close()


class _Blocks:
    """The content blocks of a streamed message: opens, fills and closes them in order."""

    def __init__(self) -> None:
        self.count = 0  # blocks started so far
        self.open: str | None = None  # the type of the block being filled
        self.calls = 0

    def add(self, item: Part) -> list[dict[str, Any]]:
        """The events that carry one piece of parsed output: thinking, text, a call's start, or its arguments."""
        events: list[dict[str, Any]] = []
        if isinstance(item, ArgumentsDelta):
            return [self._delta({"type": "input_json_delta", "partial_json": item.text})]
        if isinstance(item, Reasoning):
            if self.open != "thinking":
                events += self.close()
                events += self._start({"type": "thinking", "thinking": "", "signature": ""})
            return [*events, self._delta({"type": "thinking_delta", "thinking": item.text})]
        if isinstance(item, CallStart):
            self.calls += 1
            events += self.close()
            events += self._start({"type": "tool_use", "id": tool_use_id(item.id), "name": item.name, "input": {}})
            return events
        if not item:
            return events
        if self.open != "text":
            events += self.close()
            events += self._start({"type": "text", "text": ""})
        return [*events, self._delta({"type": "text_delta", "text": item})]

    def close(self) -> list[dict[str, Any]]:
        """Close the open block, if any."""
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.count - 1}]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        self.open = block["type"]
        self.count += 1
        events = [{"type": "content_block_start", "index": self.count - 1, "content_block": block}]
        return [*events, {"type": "ping"}] if self.count == 1 else events

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.count - 1, "delta": delta}


class MessageStream(OpenStream):
    """The named SSE events of one streamed message, whose first worker event already arrived."""

    def __init__(self, request_events: RequestEvents, response_id: str, model: str, *, tools: bool, reasoning: bool = False,
                 reply_format: str = "default", priming: asyncio.Task[None] | None = None, keepalive_s: float = 10.0,
                 errors: ErrorLog | None = None) -> None:
        self._request_events = request_events
        self._id = response_id
        self._model = model
        self._parser = ReplyParser(reasoning=reasoning, tools=tools, reply_format=reply_format) \
            if needs_parsing(reply_format, chat=True, reasoning=reasoning, tools=tools) else None
        self._priming = priming  # still waiting for the first event: the stream opens with `: queued`
        self._keepalive_s = keepalive_s
        self._errors = errors

    def __aiter__(self) -> AsyncIterator[dict[str, Any] | Comment]:
        return self._events()

    def _start(self) -> dict[str, Any]:
        message = {"id": self._id, "type": "message", "role": "assistant", "model": self._model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": usage_body(Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0))}
        return {"type": "message_start", "message": message}

    def _parse(self, text: str) -> list[Part]:
        if self._parser is None:
            return [text] if text else []
        return self._parser.feed(text)

    async def _events(self) -> AsyncIterator[dict[str, Any] | Comment]:
        blocks, finish, stop = _Blocks(), None, None
        try:
            async for comment in queued_comments(self._priming, self._keepalive_s):
                yield comment  # SSE comments: the event sequence itself starts once the job does
            yield self._start()
            while (item := await self._request_events.next_within(self._keepalive_s)) is not None:
                if item is STILL_WAITING:  # no event for a while (failover, Redis pause): show the stream lives
                    yield Comment("keep-alive")
                    continue
                _, event = item
                if isinstance(event, TokenEvent):
                    pieces = self._parse(event.text)
                else:
                    finish, stop = event.finish_reason, event.stop_sequence
                    pieces = self._parser.finish() if self._parser is not None else []
                    if self._parser is not None:  # a tool turn cut only in a further call ends as tool_use
                        finish = self._parser.finish_reason(finish)
                for piece in pieces:
                    for out in blocks.add(piece):
                        yield out
            for out in self._closing(blocks, finish, stop):
                yield out
            self.ended()
            yield {"type": "message_stop"}
            log.info("%s streamed: %d completion tokens", self._id, self._request_events.usage.completion_tokens)
        except Exception as exc:  # an LLMFleetError as itself; anything else is a bug, still ending the stream
            yield self._failed(exc)
        finally:
            await self.aclose()

    def _closing(self, blocks: _Blocks, finish: str | None, stop: str | None) -> list[dict[str, Any]]:
        """The events that close the open block and carry the stop reason and usage (message_stop follows)."""
        events = list(blocks.close())
        if blocks.count == 0:
            events.append({"type": "ping"})
        delta = {"stop_reason": stop_reason(finish, stop, blocks.calls > 0), "stop_sequence": stop}
        dropped = self._parser.dropped if self._parser is not None else 0
        events.append({"type": "message_delta", "delta": delta, "usage": usage_body(self._request_events.usage, dropped)})
        return events

    def _failed(self, exc: Exception) -> dict[str, Any]:
        """The error event that ends a stream after it began (logged and kept with the fleet's recent errors)."""
        if isinstance(exc, LLMFleetError):
            log.info("%s failed after the stream began: %s %s", self._id, exc.status, exc.code)
            error = exc
        else:
            log.exception("%s broke after the stream began", self._id)
            error = InternalError("The server had an error while processing your request.")
        record_streamed_error(self._errors, error, "/v1/messages")
        self.ended()
        return error_body(error)
