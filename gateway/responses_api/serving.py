"""Serve Responses API requests on the chat jobs (gateway/openai/serving.py; no Starlette here).

Generation goes through gateway/openai/serving.py like every chat request: the same admission, placement, deadlines,
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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from gateway.cluster.broker import Broker
from gateway.http.api_keys import current_key
from gateway.http.sse import Comment
from gateway.openai import serving
from gateway.openai.protocol import ChatRequest
from gateway.replies.generation import Generation
from gateway.replies.parser import Part, ReplyParser
from gateway.replies.reasoning import Reasoning
from gateway.replies.tool_calls import ArgumentsDelta, CallStart
from gateway.responses_api import bodies
from gateway.responses_api.items import item_id, resolve_references, with_ids
from gateway.responses_api.protocol import ResponsesRequest, chat_request
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


async def prepare(store: ResponseStore, request: ResponsesRequest, settings: Settings) -> Prepared:
    """Load the history of previous_response_id (404 when it is gone) and build the chat request."""
    key = current_key.get()
    key_name = key.name if key is not None else None
    history: list[dict[str, Any]] = []
    if request.previous_response_id is not None:
        previous = await store.load(request.previous_response_id, key_name, previous=True)
        if previous.response["status"] in RUNNING:
            raise InvalidRequest(f"Previous response '{request.previous_response_id}' is still in progress.",
                                 param="previous_response_id")
        history = previous.conversation
    request_id, now = serving.new_request_id(), time.time()
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


async def _run(broker: Broker, store: ResponseStore, prepared: Prepared, settings: Settings) -> dict[str, Any]:
    """Run the job to the end and store the result; a failure or cancellation is stored too."""
    try:
        done = await serving.collect_completion(broker, prepared.chat, settings, request_id=prepared.request_id)
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


async def create_response(broker: Broker, store: ResponseStore, request: ResponsesRequest,
                          settings: Settings) -> dict[str, Any]:
    """Run a request to the end and answer with one response object."""
    prepared = await prepare(store, request, settings)
    await _save_running(store, prepared)
    return await _run(broker, store, prepared, settings)


async def start_background(broker: Broker, store: ResponseStore, request: ResponsesRequest,
                           settings: Settings) -> dict[str, Any]:
    """Store the response `in_progress`, run it in a task of this gateway, and answer at once."""
    prepared = await prepare(store, request, settings)
    body = await _save_running(store, prepared)

    async def run() -> None:
        """The background job: its result (or failure) ends up in the stored record."""
        try:
            await _run(broker, store, prepared, settings)
        except LLMFleetError as exc:
            log.info("background %s failed: %s %s", prepared.rid, exc.status, exc.code)

    task = asyncio.create_task(run())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return body


async def cancel_response(broker: Broker, store: ResponseStore, rid: str, key: str | None) -> dict[str, Any]:
    """Cancel a running response from any gateway: its job ends 'cancelled' and the gateway running it stores
    the final object; a finished response is a 400."""
    record = await store.load(rid, key)
    status = record.response["status"]
    if status not in RUNNING:
        raise InvalidRequest(f"Cannot cancel a response that is {status}.", param="response_id")
    await broker.cancel(record.request_id, record.model, "cancelled_by_client", record.deadline)
    return {**record.response, "status": "cancelled"}


async def stream_response(broker: Broker, store: ResponseStore, request: ResponsesRequest,
                          settings: Settings) -> ResponseStream:
    """Start a request and wait a moment for its first event (errors until then are raised); then stream it."""
    prepared = await prepare(store, request, settings)
    await _save_running(store, prepared)
    try:
        started = await serving.start_stream(broker, prepared.chat, settings, request_id=prepared.request_id)
    except LLMFleetError as exc:
        await _save_final(store, prepared, prepared.body("failed", error=exc))
        raise
    parser = ReplyParser(reasoning=prepared.chat.reasoning, tools=prepared.chat.tools.active, forced_open=started.opens_thinking)
    return ResponseStream(started, prepared, store, parser=parser, keepalive_s=settings.sse_keepalive_s,
                          broker=broker)


class _Output:
    """The output items of a streamed response: opens, fills and closes them in order (events unnumbered)."""

    def __init__(self, rid: str) -> None:
        self._rid = rid  # item ids name their response (gateway/responses_api/items.py)
        self.items: list[dict[str, Any]] = []
        self._message: dict[str, Any] | None = None  # the message item being filled
        self._reasoning: dict[str, Any] | None = None  # the reasoning item being filled (it comes first)
        self._call: dict[str, Any] | None = None  # a call whose arguments are still coming
        self._deltas: list[str] = []

    def add(self, piece: Part) -> list[dict[str, Any]]:
        """The events that carry one piece of parsed output: thinking, text, a call's start, or its arguments."""
        if isinstance(piece, Reasoning):
            return self._think(piece.text)
        return self._close_reasoning("completed") + self._answer(piece)

    def _answer(self, piece: Part) -> list[dict[str, Any]]:
        if isinstance(piece, ArgumentsDelta):
            assert self._call is not None
            self._call["arguments"] += piece.text
            self._deltas.append(piece.text)
            return []
        if isinstance(piece, CallStart):
            events = self._close_message("completed") + self._flush_call()
            self._call, self._deltas = {"id": piece.id, "name": piece.name, "arguments": ""}, []
            return events
        if not piece:
            return []
        events = self._flush_call() + self._open_message()
        assert self._message is not None
        self._message["text"] += piece
        return [*events, {**self._part_ref(), "type": "response.output_text.delta", "delta": piece, "logprobs": []}]

    def close(self, finish_reason: str | None) -> list[dict[str, Any]]:
        """Close what is open at the end of the reply (an empty reply is one empty message)."""
        status = "incomplete" if finish_reason in ("length", "cancelled") else "completed"
        events = self._close_reasoning(status) + self._close_message(status) + self._flush_call()
        if not self.items:
            events = self._open_message() + self._close_message(status)
        return events

    def _think(self, text: str) -> list[dict[str, Any]]:
        """A piece of the thinking block: opens the reasoning item on the first one."""
        if not text or (self._reasoning is not None and "text" not in self._reasoning):
            return []  # the splitter sends all thinking before the answer: nothing comes after it closed
        events = []
        if self._reasoning is None:
            self._reasoning = bodies.reasoning_item(item_id("rs", self._rid), None, "in_progress")
            self.items.append(self._reasoning)
            events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1,
                           "item": dict(self._reasoning)})
            self._reasoning["text"] = ""
        self._reasoning["text"] += text
        return [*events, {**self._reasoning_ref(), "type": "response.reasoning_text.delta", "delta": text}]

    def _reasoning_ref(self) -> dict[str, Any]:
        assert self._reasoning is not None
        return {"item_id": self._reasoning["id"], "output_index": self.items.index(self._reasoning),
                "content_index": 0}

    def _close_reasoning(self, status: str) -> list[dict[str, Any]]:
        if self._reasoning is None or "text" not in self._reasoning:
            return []
        ref, text = self._reasoning_ref(), self._reasoning.pop("text")
        item = bodies.reasoning_item(self._reasoning["id"], text, status)
        self.items[ref["output_index"]] = self._reasoning = item  # closed: later thinking opens nothing new
        return [{**ref, "type": "response.reasoning_text.done", "text": text},
                {"type": "response.output_item.done", "output_index": ref["output_index"], "item": item}]

    def _open_message(self) -> list[dict[str, Any]]:
        if self._message is not None:
            return []
        self._message = bodies.message_item(item_id("msg", self._rid), None, "in_progress")
        index = len(self.items)
        self.items.append(self._message)
        events = [{"type": "response.output_item.added", "output_index": index, "item": dict(self._message)},
                  {**self._part_ref(), "type": "response.content_part.added", "part": bodies.text_part("")}]
        self._message["text"] = ""
        return events

    def _part_ref(self) -> dict[str, Any]:
        assert self._message is not None
        return {"item_id": self._message["id"], "output_index": self.items.index(self._message), "content_index": 0}

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self._message is None:
            return []
        ref, text = self._part_ref(), self._message.pop("text")
        index = ref["output_index"]
        item = bodies.message_item(self._message["id"], text, status)
        self.items[index], self._message = item, None
        return [{**ref, "type": "response.output_text.done", "text": text, "logprobs": []},
                {**ref, "type": "response.content_part.done", "part": bodies.text_part(text)},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def _flush_call(self) -> list[dict[str, Any]]:
        """Announce the pending call now that it is over, if its arguments are whole JSON; else drop it."""
        call, deltas, self._call, self._deltas = self._call, self._deltas, None, []
        if call is None or not bodies.is_complete_call(call["arguments"]):
            return []
        index, item = len(self.items), bodies.call_item(item_id("fc", self._rid), call)
        self.items.append(item)
        ref = {"item_id": item["id"], "output_index": index}
        events: list[dict[str, Any]] = [{"type": "response.output_item.added", "output_index": index,
                                         "item": {**item, "status": "in_progress", "arguments": ""}}]
        events += [{**ref, "type": "response.function_call_arguments.delta", "delta": delta} for delta in deltas]
        events.append({**ref, "type": "response.function_call_arguments.done", "name": call["name"],
                       "arguments": call["arguments"]})
        return [*events, {"type": "response.output_item.done", "output_index": index, "item": item}]


class ResponseStream(serving.OpenStream):
    """The typed SSE events of one streamed response, whose job already started (or is still queued)."""

    def __init__(self, started: serving.StartedStream, prepared: Prepared, store: ResponseStore, *,
                 parser: ReplyParser, keepalive_s: float, broker: Broker) -> None:
        self._generation: Generation = started.generation
        self._priming = started.priming
        self._prepared = prepared
        self._store_client = store
        self._parser = parser  # thinking split off, then tool calls held until whole
        self._keepalive_s = keepalive_s
        self._errors = broker.errors
        self._sequence = 0
        self._output = _Output(prepared.rid)
        self._stored = False  # the final object went to the store (or there is none to write)

    async def aclose(self) -> None:
        """Store the final object (`cancelled` when the client went away first), then close the job."""
        if not self._stored:
            self._output.close("cancelled")
            await self._store(self._prepared.body("cancelled", output=self._output.items,
                                                  usage=self._generation.usage))
        await super().aclose()

    async def _store(self, final: dict[str, Any]) -> None:
        self._stored = True
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
            async for comment in serving.queued_comments(self._priming, self._keepalive_s):
                yield comment
            yield {"type": "response.created", "response": prepared.body("in_progress")}
            yield {"type": "response.in_progress", "response": prepared.body("in_progress")}
            finish = None
            while (item := await self._generation.next()) is not None:
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
            status = bodies.status_of(finish)
            final = prepared.body(status, output=output.items, usage=self._generation.usage,
                                  dropped_tool_calls=self._parser.dropped)
            await self._store(final)
            yield {"type": "response.completed" if status == "completed" else "response.incomplete",
                   "response": final}
            log.info("%s streamed: %d completion tokens", prepared.rid, self._generation.usage.completion_tokens)
        except LLMFleetError as exc:
            log.info("%s failed after the stream began: %s %s", prepared.rid, exc.status, exc.code)
            final = await self._failed(exc, output)
            yield bodies.error_event(exc, 0)
            yield {"type": "response.failed", "response": final}
        except Exception:  # a bug: still end the stream with an error event
            log.exception("%s broke after the stream began", prepared.rid)
            error = InternalError("The server had an error while processing your request.")
            final = await self._failed(error, output)
            yield bodies.error_event(error, 0)
            yield {"type": "response.failed", "response": final}
        finally:
            await self.aclose()

    async def _failed(self, error: LLMFleetError, output: _Output) -> dict[str, Any]:
        serving.record_streamed_error(self._errors, error, "/v1/responses")
        output.close("length")  # what was streamed so far, closed as incomplete
        final = self._prepared.body("failed", output=output.items, usage=self._generation.usage, error=error)
        await self._store(final)
        return final
