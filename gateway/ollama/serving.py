"""Serve validated Ollama requests on the gateway's job layer (gateway/replies/serving.py); no Starlette here.

Generation goes through the same functions as chat completions (admission, deadlines, metrics, rate-limit
charges, cancellation when the client goes away, failover by journal replay); this module only shapes what
comes back:
- a reply: {model, created_at, message {role, content, tool_calls} (chat) or response (generate), done, ...};
  its last (or only) object adds done_reason ("stop" or "length"), total_duration, load_duration,
  prompt_eval_count, prompt_eval_duration, eval_count, eval_duration (nanoseconds). total_duration is the
  gateway's time from the request to its end; the others come from the worker's timing: load_duration is the
  time the job waited for a slot (a lazily loaded model's load included), prompt_eval_duration the time to the
  first token after that, eval_duration the rest.
- a stream: one JSON object per line, each with a piece of the text; tool calls come whole, in one object before
  the last (Ollama's arguments are objects, so a call is sent once its arguments are complete; a call cut short
  by num_predict is dropped). While the request is queued, objects with empty content keep the line alive (NDJSON
  has no comments). A failure after the stream began is a last line {"error": ...}.
- an empty chat or prompt: no job; the model is loaded (or, with keep_alive 0, unloaded) and done_reason says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.cluster.warm_pool import WarmPool
from gateway.http.error_log import ErrorLog
from gateway.http.fields import invalid
from gateway.ollama.errors import error_body
from gateway.ollama.models import context_length
from gateway.ollama.protocol import OllamaEmbedding, OllamaGeneration
from gateway.replies import serving
from gateway.replies.parser import ReplyParser
from gateway.replies.protocol import ChatRequest
from gateway.replies.reasoning import Reasoning
from gateway.replies.request_events import RequestEvents
from gateway.replies.streaming import OpenStream, queued_comments, record_streamed_error
from shared.errors import InternalError, LLMFleetError, ModelNotFound
from shared.messages import Timing, TokenEvent, Usage
from shared.settings import Settings

log = logging.getLogger(__name__)

NS_PER_S = 1_000_000_000


def created_at(unix_s: float) -> str:
    """Ollama's created_at: RFC 3339 in UTC with microseconds."""
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ns(seconds: float) -> int:
    return max(0, round(seconds * NS_PER_S))


def done_fields(reason: str | None, usage: Usage, timings: list[Timing], total_s: float,
                dropped_tool_calls: int = 0) -> dict[str, Any]:
    """The fields of a reply's last object: why it ended, its token counts and durations (ns); llmfleet's
    dropped_tool_calls when a call cut short by num_predict was left out (a tool turn cut only there is "stop")."""
    timing = timings[0] if timings else Timing(queue_s=0.0, first_token_s=0.0, total_s=0.0)
    dropped = {"dropped_tool_calls": dropped_tool_calls} if dropped_tool_calls else {}
    return {**dropped, "done": True, "done_reason": "length" if reason == "length" else "stop",
            "total_duration": _ns(total_s), "load_duration": _ns(timing.queue_s),
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": _ns(timing.first_token_s - timing.queue_s),
            "eval_count": usage.completion_tokens, "eval_duration": _ns(timing.total_s - timing.first_token_s)}


def tool_calls(calls: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Ollama's tool_calls for parsed calls: arguments as an object; a call whose arguments are not a whole JSON
    object (cut short by num_predict) is left out."""
    out = []
    for call in calls:
        try:
            arguments = json.loads(call["arguments"])
        except ValueError:
            continue
        if isinstance(arguments, dict):
            out.append({"function": {"index": len(out), "name": call["name"], "arguments": arguments}})
    return out


def reply(request: OllamaGeneration, when: float, text: str, calls: list[dict[str, Any]] | None = None,
          thinking: str | None = None) -> dict[str, Any]:
    """One reply object, not yet done: a chat message or a generate response (with its thinking, if any)."""
    body: dict[str, Any] = {"model": request.model, "created_at": created_at(when)}
    if request.kind == "chat":
        body["message"] = {"role": "assistant", "content": text}
        if thinking:
            body["message"]["thinking"] = thinking
        if calls:
            body["message"]["tool_calls"] = calls
    else:
        body["response"] = text
        if thinking:
            body["thinking"] = thinking
    body["done"] = False
    return body


async def check_context(registry: Registry, request: OllamaGeneration) -> None:
    """options.num_ctx may not exceed the model's context (skipped while no live worker says what it is)."""
    if request.num_ctx is None:
        return
    context = await context_length(registry, request.served_model)
    if context is not None and request.num_ctx > context:
        raise invalid("options.num_ctx", f"{request.num_ctx} is larger than the model's context length "
                                         f"({context} tokens).")


async def load_only(registry: Registry, pool: WarmPool, request: OllamaGeneration) -> dict[str, Any]:
    """An empty chat or prompt: mark the model used (loading it if it is pooled and not loaded), or with keep_alive
    0 unload it; done_reason "load" or "unload"."""
    model = request.served_model
    live, catalogue = await registry.live_models(), await pool.catalogue()
    if model not in live and model not in catalogue and not await registry.is_known(model):
        raise ModelNotFound(f"model '{request.model}' not found", param="model")
    reason = "load"
    if request.keep_alive == 0:
        reason = "unload"
        if model in catalogue:
            await pool.command("unload", model)
    elif model in catalogue:
        await pool.note_use(model, request.keep_alive)
        if model not in live:
            await pool.command("load", model)
    body = reply(request, time.time(), "")
    body.update({"done": True, "done_reason": reason})
    return body


async def run_generation(broker: Broker, registry: Registry, request: OllamaGeneration,
                         settings: Settings) -> dict[str, Any]:
    """Run a chat or generate request to the end and answer with one object."""
    assert request.request is not None
    started = time.monotonic()
    await check_context(registry, request)
    done = await serving.collect_completion(broker, registry, request.request, settings)
    choice = done.choices[0]
    body = reply(request, done.created, choice.text or "", tool_calls(choice.tool_calls or []), choice.reasoning)
    body.update(done_fields(choice.finish_reason, done.usage, done.timings, time.monotonic() - started,
                            choice.dropped_calls))
    return body


async def stream_generation(broker: Broker, registry: Registry, request: OllamaGeneration,
                            settings: Settings) -> ReplyStream:
    """Start a chat or generate request and wait a moment for its first event (errors until then are raised)."""
    assert request.request is not None
    started_at = time.monotonic()
    await check_context(registry, request)
    started = await serving.start_stream(broker, registry, request.request, settings)
    chat = isinstance(request.request, ChatRequest)
    parser = ReplyParser(reasoning=chat and request.request.reasoning, tools=chat and request.request.tools.active,
                         reply_format=started.reply_format)
    return ReplyStream(started.request_events, request, started_at=started_at, parser=parser, priming=started.priming,
                       keepalive_s=settings.sse_keepalive_s, errors=broker.errors)


class ReplyStream(OpenStream):
    """The reply objects of one streamed chat or generate request, whose first worker event already arrived."""

    def __init__(self, request_events: RequestEvents, request: OllamaGeneration, *, started_at: float, parser: ReplyParser,
                 priming: asyncio.Task[None] | None = None, keepalive_s: float = 10.0,
                 errors: ErrorLog | None = None) -> None:
        self._request_events = request_events
        self._request = request
        self._started_at = started_at
        self._parser = parser  # thinking split off, then tool calls held until whole
        self._priming = priming  # still waiting for the first event: empty objects keep the line alive
        self._keepalive_s = keepalive_s
        self._errors = errors

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._objects()

    def _objects_of(self, text: str | None) -> list[dict[str, Any]]:
        """The reply objects a token's text (None: the reply ended) releases: thinking, then content; tool calls
        are held by the parser until the end."""
        parts = self._parser.feed(text) if text is not None else self._parser.finish()
        objects = []
        for part in parts:
            if isinstance(part, Reasoning) and part.text:
                objects.append(reply(self._request, time.time(), "", thinking=part.text))
            elif isinstance(part, str) and part:
                objects.append(reply(self._request, time.time(), part))
        return objects

    async def _objects(self) -> AsyncIterator[dict[str, Any]]:
        path = f"/api/{self._request.kind}"
        try:
            async for _comment in queued_comments(self._priming, self._keepalive_s):
                yield reply(self._request, time.time(), "")
            finish = None
            while (item := await self._request_events.next()) is not None:
                _, event = item
                for body in self._objects_of(event.text if isinstance(event, TokenEvent) else None):
                    yield body
                if not isinstance(event, TokenEvent):  # after finish(): a tool turn cut in a further call stops
                    finish = self._parser.finish_reason(event.finish_reason)
            calls = tool_calls(self._parser.calls)
            if calls:
                yield reply(self._request, time.time(), "", calls)
            last = reply(self._request, time.time(), "")
            last.update(done_fields(finish, self._request_events.usage, self._request_events.timings,
                                    time.monotonic() - self._started_at, self._parser.dropped))
            yield last
            log.info("%s streamed: %d completion tokens", path, self._request_events.usage.completion_tokens)
        except LLMFleetError as exc:
            log.info("%s failed after the stream began: %s %s", path, exc.status, exc.code)
            record_streamed_error(self._errors, exc, path)
            yield error_body(exc)
        except Exception:  # a bug: still end the stream with an error line
            log.exception("%s broke after the stream began", path)
            error = InternalError("The server had an error while processing your request.")
            record_streamed_error(self._errors, error, path)
            yield error_body(error)
        finally:
            await self.aclose()


async def run_embedding(broker: Broker, request: OllamaEmbedding, settings: Settings) -> dict[str, Any]:
    """/api/embed's {model, embeddings, total_duration, load_duration, prompt_eval_count}, or /api/embeddings'
    {embedding}, from one embed job on the embeddings path."""
    started = time.monotonic()
    body = await serving.run_embeddings(broker, request.request, settings)
    vectors = [item["embedding"] for item in body["data"]]
    if request.legacy:
        return {"embedding": vectors[0]}
    return {"model": request.model, "embeddings": vectors, "total_duration": _ns(time.monotonic() - started),
            "load_duration": 0, "prompt_eval_count": body["usage"]["prompt_tokens"]}
