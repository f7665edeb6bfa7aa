"""Serve Responses API requests on the chat jobs (gateway/replies/serving.py; no Starlette here).

RequestEvents goes through gateway/replies/serving.py like every chat request: the same admission, placement, deadlines,
metrics, key charges, cancellation on disconnect and failover (the event stream resumes from the journal).
This module loads the history of previous_response_id, names the response before its job starts (the job's
request id is the response id's digits), stores the record (`in_progress` first, so any gateway can cancel it,
then the final one) and shapes what comes back:
- create_response: one response object; a tool call cut short by max_output_tokens is left out (status
  `incomplete`, incomplete_details.reason `max_output_tokens`, unless the cut call followed complete calls
  only: then the turn is `completed` and usage.dropped_tool_calls counts it); a cancelled job is `cancelled`.
- start_background: the record is stored `in_progress` and returned at once; a task of this gateway runs the
  job and stores the result (GET polls it, POST .../cancel stops it).
- stream_response: the typed events, each with its sequence_number: response.created, response.in_progress,
  per output item response.output_item.added, (message) response.content_part.added, response.output_text.delta
  ..., response.output_text.done, response.content_part.done, or (function_call) function_call_arguments.delta
  ..., function_call_arguments.done; then response.output_item.done; and last response.completed (or
  response.incomplete when cut short or cancelled). A call is announced once its arguments are whole JSON, so a
  call cut short never appears. A failure after the stream began is an `error` event then response.failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.cluster.streams import StreamRecord
from gateway.http.api_keys import current_key
from gateway.http.sse import Comment
from gateway.replies import resume, serving
from gateway.replies.parser import ReplyParser
from gateway.replies.protocol import ChatRequest
from gateway.replies.request_events import RequestEvents
from gateway.replies.streaming import OpenStream, queued_comments, record_streamed_error
from gateway.responses_api import bodies
from gateway.responses_api.items import resolve_references, with_ids
from gateway.responses_api.output import Output
from gateway.responses_api.protocol import ResponsesRequest, chat_request, parse_request
from gateway.responses_api.store import RUNNING, ResponseStore, StoredResponse
from shared.errors import InternalError, InvalidRequest, LLMFleetError
from shared.messages import TokenEvent
from shared.settings import Settings

log = logging.getLogger(__name__)

STORE_TIMEOUT_S = 5.0
_BACKGROUND: set[asyncio.Task[None]] = set()  # background responses running on this gateway


@dataclass
class Prepared:
    """A request ready to run: its chat request, ids, and the record it is stored as."""

    request: ResponsesRequest
    chat: ChatRequest
    request_id: str
    rid: str
    created: float
    history: list[dict[str, Any]]
    key: str | None
    deadline: float
    saved: bool = field(default=False)

    def record(self, response: dict[str, Any]) -> StoredResponse:
        """The stored form of `response` (a snapshot or the final object)."""
        return StoredResponse(response=response, history=self.history, request_id=self.request_id,
                              model=self.chat.params.model, key=self.key, deadline=self.deadline)

    def body(self, status: str, **fields: Any) -> dict[str, Any]:
        """The response object in `status`."""
        return bodies.response_body(self.request, self.rid, self.created, status=status, **fields)


async def prepare(store: ResponseStore, request: ResponsesRequest, settings: Settings, *,
                  request_id: str | None = None, created: float | None = None) -> Prepared:
    """Load the history of previous_response_id (404 when it is gone) and build the chat request (again, for a
    resumed or adopted response: the same ids and times)."""
    key = current_key.get()
    key_name = key.name if key is not None else None
    history: list[dict[str, Any]] = []
    if request.previous_response_id is not None:
        previous = await store.load(request.previous_response_id, key_name, previous=True)
        if previous.response["status"] in RUNNING:
            raise InvalidRequest(f"Previous response '{request.previous_response_id}' is still in progress.",
                                 param="previous_response_id")
        history = previous.conversation
    request_id, now = request_id or serving.new_request_id(), created or time.time()
    rid = bodies.response_id(request_id)
    items = with_ids(await resolve_references(store, request.items, history, key_name), rid)
    chat = chat_request(replace(request, items=items), history, settings)
    return Prepared(request, chat, request_id, rid, now, [*history, *items], key_name,
                    now + settings.request_timeout_s)


async def _save_running(store: ResponseStore, prepared: Prepared) -> dict[str, Any]:
    """Store the response `in_progress` (when it is to be stored): from now on any gateway can cancel it."""
    body = prepared.body("in_progress")
    if prepared.request.store:
        await store.save(prepared.record(body))
        prepared.saved = True
    return body


async def _save_final(store: ResponseStore, prepared: Prepared, body: dict[str, Any]) -> None:
    """Store the final object, even while the request is being cancelled (bounded in time)."""
    if not prepared.saved:
        return
    with anyio.move_on_after(STORE_TIMEOUT_S, shield=True):
        await store.save_quietly(prepared.record(body))


async def _run(broker: Broker, registry: Registry, store: ResponseStore, prepared: Prepared, settings: Settings, *,
               background: bool = False, follow: RequestEvents | None = None) -> dict[str, Any]:
    """Run the job to the end (or `follow` one already running) and store the result; a failure or cancellation
    is stored too. A background response's stream record is written: it can be streamed and adopted."""
    try:
        if follow is not None:
            done = await serving.collect_events(registry, prepared.chat, follow, prepared.request_id,
                                                    prepared.created)
        else:
            done = await serving.collect_completion(broker, registry, prepared.chat, settings,
                                                    request_id=prepared.request_id,
                                                    stream_id=prepared.rid if background else None)
    except LLMFleetError as exc:
        await _save_final(store, prepared, prepared.body("failed", error=exc))
        raise
    except Exception:
        error = InternalError("The server had an error while processing your request.")
        await _save_final(store, prepared, prepared.body("failed", error=error))
        raise
    except BaseException:  # cancelled: the client went away, or the gateway is stopping
        await _save_final(store, prepared, prepared.body("cancelled"))
        raise
    choice = done.choices[0]
    calls = choice.tool_calls or []
    output = bodies.output_items(choice.text, calls, choice.finish_reason, choice.reasoning, rid=prepared.rid)
    body = prepared.body(bodies.status_of(choice.finish_reason), output=output, usage=done.usage,
                         dropped_tool_calls=choice.dropped_calls)
    await _save_final(store, prepared, body)
    return body


async def create_response(broker: Broker, registry: Registry, store: ResponseStore, request: ResponsesRequest,
                          settings: Settings) -> dict[str, Any]:
    """Run a request to the end and answer with one response object."""
    prepared = await prepare(store, request, settings)
    await _save_running(store, prepared)
    return await _run(broker, registry, store, prepared, settings)


async def start_background(broker: Broker, registry: Registry, store: ResponseStore, request: ResponsesRequest,
                           settings: Settings, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Store the response `in_progress`, run it in a task of this gateway, and answer at once. With the request
    body `raw` its events can be streamed (GET ...?stream=true) and another gateway finishes it if this one dies."""
    prepared = await prepare(store, request, settings)
    body = await _save_running(store, prepared)
    if raw is not None:  # before the job is queued: its owner is known from the start
        key = current_key.get()
        await broker.streams.open(StreamRecord(
            stream_id=prepared.rid, api="responses", body=raw, request_id=prepared.request_id,
            job_ids=[prepared.request_id], model=prepared.chat.params.model, created=prepared.created,
            deadline=prepared.deadline, key=key.name if key is not None else None, background=True))
    _in_background(_run(broker, registry, store, prepared, settings, background=raw is not None), prepared.rid)
    return body


def _in_background(work: Coroutine[Any, Any, dict[str, Any]], rid: str) -> None:
    """Run a background response's work in a task of this gateway."""

    async def run() -> None:
        """The background job: its result (or failure) ends up in the stored record."""
        try:
            await work
        except LLMFleetError as exc:
            log.info("background %s failed: %s %s", rid, exc.status, exc.code)

    task = asyncio.create_task(run())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def install(broker: Broker, registry: Registry, settings: Settings) -> None:
    """Let this gateway finish the background responses of a dead gateway, and mark a response whose stream
    nobody resumed (its job cancelled) as cancelled."""
    store = ResponseStore(broker.redis, settings)

    async def adopt(record: StreamRecord) -> None:
        """Follow a dead gateway's background response from its journal to the end, and store it."""
        prepared = await _prepared_again(store, record, settings)
        request_events = await resume.follow(broker, record, 1)
        try:
            await _run(broker, registry, store, prepared, settings, follow=request_events)
        finally:
            await broker.streams.finish(record.stream_id)

    async def reaped(record: StreamRecord) -> None:
        """The job of a response nobody listened to was cancelled: so is the stored response."""
        await store.mark_cancelled(record.stream_id)

    broker.streams.adopter = adopt
    broker.streams.on_reaped["responses"] = reaped


async def _prepared_again(store: ResponseStore, record: StreamRecord, settings: Settings) -> Prepared:
    """The Prepared of a response being resumed or adopted, from its stream record (stored, if it is to be)."""
    prepared = await prepare(store, parse_request(record.body, settings), settings, request_id=record.request_id,
                             created=record.created)
    prepared.saved = prepared.request.store
    return prepared

async def cancel_response(broker: Broker, store: ResponseStore, rid: str, key: str | None) -> dict[str, Any]:
    """Cancel a running response from any gateway: its job ends 'cancelled' and the gateway running it stores
    the final object; a finished response is a 400."""
    record = await store.load(rid, key)
    status = record.response["status"]
    if status not in RUNNING:
        raise InvalidRequest(f"Cannot cancel a response that is {status}.", param="response_id")
    await broker.cancel(record.request_id, record.model, "cancelled_by_client", record.deadline)
    return {**record.response, "status": "cancelled"}


async def stream_response(broker: Broker, registry: Registry, store: ResponseStore, request: ResponsesRequest,
                          settings: Settings, raw: dict[str, Any] | None = None) -> ResponseStream:
    """Start a request and wait a moment for its first event (errors until then are raised); then stream it.
    With the request body `raw` it is resumable; a background one runs in a task of this gateway (and survives
    the client) while the stream follows it."""
    if request.background and raw is not None:
        body = await start_background(broker, registry, store, request, settings, raw)
        return await reopen_stream(broker, store, body["id"], settings, after=-1)
    prepared = await prepare(store, request, settings)
    await _save_running(store, prepared)
    try:
        started = await serving.start_stream(broker, registry, prepared.chat, settings,
                                             request_id=prepared.request_id,
                                             resumable=("responses", prepared.rid, raw) if raw else None)
    except LLMFleetError as exc:
        await _save_final(store, prepared, prepared.body("failed", error=exc))
        raise
    stream = _response_stream(broker, store, settings, prepared, started)
    stream.resumable(broker.streams, started.stream_id)
    return stream


async def reopen_stream(broker: Broker, store: ResponseStore, rid: str, settings: Settings, *,
                        after: int) -> ResponseStream:
    """A response's stream again (GET /v1/responses/{id}?stream=true, or a background response streamed), from
    its first event: a background response is only followed, any other is taken over (gateway/replies/resume.py)."""
    record = await resume.reopen(broker, rid, ("responses",), after)
    prepared = await _prepared_again(store, record, settings)
    request_events = await resume.follow(broker, record, 1)
    started = serving.StartedStream(request_events, record.request_id, record.created, None, record.reply_format)
    stream = _response_stream(broker, store, settings, prepared, started)
    stream.resumable(broker.streams, rid, follower=record.background)
    return stream


def _response_stream(broker: Broker, store: ResponseStore, settings: Settings, prepared: Prepared,
                     started: serving.StartedStream) -> ResponseStream:
    parser = ReplyParser(reasoning=prepared.chat.reasoning, tools=prepared.chat.tools.active,
                         reply_format=started.reply_format)
    return ResponseStream(started, prepared, store, parser=parser, keepalive_s=settings.sse_keepalive_s,
                          broker=broker)


class ResponseStream(OpenStream):
    """The typed SSE events of one streamed response, whose job already started (or is still queued)."""

    def __init__(self, started: serving.StartedStream, prepared: Prepared, store: ResponseStore, *,
                 parser: ReplyParser, keepalive_s: float, broker: Broker) -> None:
        self._request_events: RequestEvents = started.request_events
        self._priming = started.priming
        self._prepared = prepared
        self._store_client = store
        self._parser = parser  # thinking split off, then tool calls held until whole
        self._keepalive_s = keepalive_s
        self._errors = broker.errors
        self._sequence = 0
        self._output = Output(prepared.rid)
        self._stored = False  # the final object went to the store (or there is none to write)

    async def aclose(self) -> None:
        """Close the job, then store the final object (`cancelled` when the client went away first and its job
        was cancelled; a job left running for a resume, or a background one, is stored by whoever ends it)."""
        await super().aclose()
        if not self._stored and not self.detached:
            self._output.close("cancelled")
            await self._store(self._prepared.body("cancelled", output=self._output.items,
                                                  usage=self._request_events.usage))

    async def _store(self, final: dict[str, Any]) -> None:
        self._stored = True
        if not self._follower:  # a background response's own task stores it
            await _save_final(self._store_client, self._prepared, final)

    def __aiter__(self) -> AsyncIterator[dict[str, Any] | Comment]:
        return self._numbered()

    async def _numbered(self) -> AsyncIterator[dict[str, Any] | Comment]:
        async for event in self._events():
            if isinstance(event, dict):
                event["sequence_number"] = self._sequence
                self._sequence += 1
            yield event

    async def _events(self) -> AsyncIterator[dict[str, Any] | Comment]:
        prepared, output = self._prepared, self._output
        try:
            async for comment in queued_comments(self._priming, self._keepalive_s):
                yield comment
            yield {"type": "response.created", "response": prepared.body("in_progress")}
            yield {"type": "response.in_progress", "response": prepared.body("in_progress")}
            finish = None
            while (item := await self._request_events.next()) is not None:
                _, event = item
                if isinstance(event, TokenEvent):
                    pieces = self._parser.feed(event.text)
                else:
                    pieces = self._parser.finish()
                    finish = self._parser.finish_reason(event.finish_reason)  # a tool turn: completed
                for piece in pieces:
                    for out in output.add(piece):
                        yield out
            for out in output.close(finish):
                yield out
            yield await self._completed(finish)
            log.info("%s streamed: %d completion tokens", prepared.rid, self._request_events.usage.completion_tokens)
        except Exception as exc:  # an LLMFleetError as itself; anything else is a bug, still ending the stream
            error = exc if isinstance(exc, LLMFleetError) else InternalError(
                "The server had an error while processing your request.")
            if error is exc:
                log.info("%s failed after the stream began: %s %s", prepared.rid, error.status, error.code)
            else:
                log.exception("%s broke after the stream began", prepared.rid)
            final = await self._failed(error, output)
            self.ended()
            yield bodies.error_event(error, 0)
            yield {"type": "response.failed", "response": final}
        finally:
            await self.aclose()

    async def _completed(self, finish: str | None) -> dict[str, Any]:
        """The final response, stored: response.completed, or response.incomplete (length, content filter)."""
        status = bodies.status_of(finish)
        final = self._prepared.body(status, output=self._output.items, usage=self._request_events.usage,
                                    dropped_tool_calls=self._parser.dropped)
        await self._store(final)
        self.ended()
        return {"type": "response.completed" if status == "completed" else "response.incomplete", "response": final}

    async def _failed(self, error: LLMFleetError, output: Output) -> dict[str, Any]:
        record_streamed_error(self._errors, error, "/v1/responses")
        output.close("length")  # what was streamed so far, closed as incomplete
        final = self._prepared.body("failed", output=output.items, usage=self._request_events.usage, error=error)
        await self._store(final)
        return final
