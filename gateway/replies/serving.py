"""Serve validated requests: build jobs, queue them, collect or stream their events (no Starlette here).

- run_completion: collects every event into one chat.completion / text_completion body (collect_completion
  gives the finished choices to other API shapes, such as Anthropic's messages).
- stream_completion: waits for the FIRST event of every job before returning, so an early failure
  (context_length_exceeded, queue full in the worker, ...) still becomes a plain HTTP error; the returned
  ChunkStream (chunk_stream.py) then yields OpenAI chunks, and a failure after that point becomes a final {"error": ...}
  chunk (the SSE layer appends [DONE]). start_stream and queued_comments are shared with Anthropic's stream.
- run_embeddings: one embed job, one embeddings list.
Whatever way a request ends, its jobs are closed in a `finally`: a job whose terminal event was not seen
(client gone, deadline, error elsewhere) gets a cancel published.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.cluster.broker import Broker
from gateway.cluster.loras import split_model
from gateway.cluster.registry import Registry
from gateway.http.api_keys import current_key
from gateway.http.error_log import note_request
from gateway.replies import bodies
from gateway.replies.bodies import ChoiceResult, ChunkHeader
from gateway.replies.chunk_stream import ChunkStream
from gateway.replies.parser import needs_parsing, whole_reply
from gateway.replies.protocol import ChatRequest, CompletionOptions, CompletionRequest, EmbedBody
from gateway.replies.reasoning import reasoning_keys
from gateway.replies.request_events import RequestEvents, charge_key
from gateway.replies.streaming import (
    StartedStream,
    new_record,
)
from shared.errors import InternalError, LLMFleetError
from shared.messages import DoneEvent, EmbedJob, ErrorEvent, GenerateJob, Timing, TokenEvent, Usage
from shared.settings import Settings

log = logging.getLogger(__name__)

GenerateBody = ChatRequest | CompletionRequest  # a parsed body that becomes GenerateJobs (EmbedBody: an EmbedJob)
Resumable = tuple[str, str, dict[str, Any] | None]  # API name, stream id, request body (gateway/cluster/streams.py)


def new_request_id() -> str:
    """A fresh request id: 'req-' and 32 hex digits."""
    return f"req-{uuid.uuid4().hex}"


def _job_base(params: CompletionOptions, settings: Settings, request_id: str, now: float) -> dict[str, Any]:
    sampling = params.sampling
    if sampling.seed is None:  # a seed lets a replacement worker continue the same stream
        sampling = msgspec.structs.replace(sampling, seed=secrets.randbits(63))
    return {
        "id": request_id,
        "model": params.model,
        "created": now,
        "deadline": now + settings.request_timeout_s,
        "priority": params.priority,
        "max_tokens": params.max_tokens,
        "n": params.n,
        "sampling": sampling,
        "stop": params.stop,
        "ignore_eos": params.ignore_eos,
        "cache_prompt": params.cache_prompt,
        "stream": params.stream,
        "constraint": params.constraint,
        "loras": list(params.loras),
    }


def build_jobs(request: GenerateBody, settings: Settings, request_id: str, now: float) -> list[GenerateJob]:
    """The generate jobs of a request: one for chat, one per prompt for completions."""
    base = _job_base(request.params, settings, request_id, now)
    if isinstance(request, ChatRequest):
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        tools = request.tools
        thinking = request.thinking
        shaped = bool(request.params.stop or request.params.constraint or tools.active or thinking.budget)
        return [GenerateJob(**base, messages=request.messages, logprobs=logprobs, tools=tools.tools,
                            tool_choice=tools.choice, tool_name=tools.name, parallel_tool_calls=tools.parallel,
                            reasoning=request.reasoning and shaped, template_kwargs=thinking.template_kwargs,
                            thinking_budget=thinking.budget)]
    jobs = []
    for i, prompt in enumerate(request.prompts):
        job_id = request_id if len(request.prompts) == 1 else f"{request_id}-{i}"
        form = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
        jobs.append(GenerateJob(**{**base, "id": job_id}, **form, logprobs=request.logprobs, echo=request.echo))
    return jobs


def build_embed_job(request: EmbedBody, settings: Settings, request_id: str, now: float) -> EmbedJob:
    """The embed job of an embeddings request."""
    return EmbedJob(
        id=request_id,
        model=request.model,
        created=now,
        deadline=now + settings.request_timeout_s,
        inputs=request.inputs,
        priority=request.priority,
        normalize=request.normalize,
    )


def _response_id(request: GenerateBody | EmbedBody, request_id: str) -> str:
    prefix = "chatcmpl-" if isinstance(request, ChatRequest) else "cmpl-"
    return prefix + request_id.removeprefix("req-")


def _uses_tools(request: GenerateBody) -> bool:
    return isinstance(request, ChatRequest) and request.tools.active


def _uses_reasoning(request: GenerateBody) -> bool:
    return isinstance(request, ChatRequest) and request.reasoning


async def reply_format(registry: Registry, request: GenerateBody) -> str:
    """How a chat reply to this request is written (gateway/replies/parser.py ReplyFormat), as its model's workers
    say in the registry: "harmony" when their chat template writes harmony (gpt-oss), "opened" when it ends the
    generation prompt with `<think>` (with and without enable_thinking), else "default"."""
    if not isinstance(request, ChatRequest):
        return "default"
    workers = (await registry.live_models()).get(split_model(request.params.model)[0], [])
    if any(worker.harmony for worker in workers):
        return "harmony"
    if not request.reasoning:
        return "default"
    if request.thinking.disabled:  # enable_thinking false: only a template that ignores the switch opens the block
        return "opened" if any(worker.opens_thinking_disabled for worker in workers) else "default"
    return "opened" if any(worker.opens_thinking for worker in workers) else "default"


def _wants_logprobs(request: GenerateBody) -> bool:
    return request.logprobs if isinstance(request, ChatRequest) else request.logprobs is not None


@dataclass(frozen=True)
class Collected:
    """A finished request's choices and usage, before they are shaped into an API's response body."""

    request_id: str
    created: float
    choices: list[ChoiceResult]
    usage: Usage
    timings: list[Timing]  # the workers' timings (llama-server's `timings` object is built from them)


async def collect_completion(broker: Broker, registry: Registry, request: GenerateBody, settings: Settings, *,
                             request_id: str | None = None, stream_id: str | None = None) -> Collected:
    """Queue the request's jobs and collect their events into finished choices (tool calls parsed out); an API
    that names its response before the job starts (the Responses API) passes the request id, and a background
    response the id of the stream record it wrote (gateway/cluster/streams.py): readers can stream it, and another
    gateway finishes it if this one dies."""
    request_id, now = request_id or new_request_id(), time.time()
    jobs = build_jobs(request, settings, request_id, now)
    try:
        request_events = await RequestEvents.start(broker, jobs, keep_alive=request.params.keep_alive)
        note_request().request_id = request_id  # queued: from here on the id is in the logs
        if stream_id is not None:
            request_events.retain()
        return await collect_events(registry, request, request_events, request_id, now)
    finally:
        if stream_id is not None:
            await broker.streams.finish(stream_id)


async def collect_events(registry: Registry, request: GenerateBody, request_events: RequestEvents, request_id: str,
                             now: float) -> Collected:
    """Collect a started (or followed) request's events into finished choices; closes them."""
    try:
        form = await reply_format(registry, request)  # after admission (see start_stream)
        parsed = needs_parsing(form, chat=isinstance(request, ChatRequest), reasoning=_uses_reasoning(request),
                               tools=_uses_tools(request))
        want_logprobs = _wants_logprobs(request)
        choices = [ChoiceResult(index=i, logprobs=[] if want_logprobs else None) for i in range(request_events.choices)]
        parts: list[list[str]] = [[] for _ in choices]
        while (item := await request_events.next()) is not None:
            index, event = item
            if isinstance(event, TokenEvent):
                parts[index].append(event.text)
                if want_logprobs and event.logprobs:
                    choices[index].logprobs.extend(event.logprobs)  # type: ignore[union-attr]
            else:
                choices[index].finish_reason = event.finish_reason
                choices[index].stop_sequence = event.stop_sequence
        for choice, texts in zip(choices, parts, strict=True):
            choice.text = "".join(texts)
            if parsed:  # a tool turn cut only in a further call ends as "tool_calls"
                reply = whole_reply(choice.text, choice.finish_reason, reasoning=_uses_reasoning(request),
                                    tools=_uses_tools(request), reply_format=form)
                choice.reasoning, choice.text, choice.tool_calls = reply.reasoning, reply.content, reply.calls or None
                choice.finish_reason, choice.dropped_calls = reply.finish_reason, reply.dropped
    finally:
        await request_events.close()
    log.info("%s done: %d choices, %d completion tokens", request_id, len(choices), request_events.usage.completion_tokens)
    return Collected(request_id, now, choices, request_events.usage, request_events.timings)


async def run_completion(broker: Broker, registry: Registry, request: GenerateBody,
                         settings: Settings) -> dict[str, Any]:
    """Queue the request's jobs and collect their events into one response body."""
    done = await collect_completion(broker, registry, request, settings)
    head = (_response_id(request, done.request_id), int(done.created), request.params.model, done.choices, done.usage)
    body = bodies.chat_completion(*head, reasoning_keys(settings.reasoning_fields)) \
        if isinstance(request, ChatRequest) else bodies.text_completion(*head)
    if request.params.timings:
        body["timings"] = bodies.timings_body(done.usage, done.timings)
    return body


async def start_stream(broker: Broker, registry: Registry, request: GenerateBody, settings: Settings, *,
                       request_id: str | None = None, resumable: Resumable | None = None) -> StartedStream:
    """Queue the request's jobs and wait a moment for their first events, so that an early failure is raised
    (a plain HTTP error); a request still queued after `sse_queued_after_s` is returned with its priming task.
    `resumable` (API name, stream id, request body): its record is written before the job is queued."""
    request_id, now = request_id or new_request_id(), time.time()
    jobs = build_jobs(request, settings, request_id, now)
    record = new_record(resumable[0], resumable[1], resumable[2], jobs) if resumable else None
    if record is not None:
        await broker.streams.open(record)
    try:
        request_events = await RequestEvents.start(broker, jobs, keep_alive=request.params.keep_alive)
    except BaseException:
        if record is not None:  # never queued (or cancelled on the way): nothing to resume
            await broker.streams.finish(record.stream_id)
        raise
    note_request().request_id = request_id  # queued: from here on the id is in the logs
    priming = asyncio.create_task(request_events.prime())
    try:
        # after admission, whose registry read it reuses: a Redis outage is admission's fast 503, not a wait here
        form = await reply_format(registry, request)
        if record is not None:
            request_events.retain()
            await broker.streams.note_format(record.stream_id, form)
        await asyncio.wait({priming}, timeout=settings.sse_queued_after_s)
        if priming.done():
            priming.result()  # raises the early failure
    except BaseException:
        priming.cancel()
        await request_events.close()
        if record is not None:
            await broker.streams.finish(record.stream_id)
        raise
    return StartedStream(request_events, request_id, now, None if priming.done() else priming, form,
                         None if record is None else record.stream_id)


async def stream_completion(broker: Broker, registry: Registry, request: GenerateBody, settings: Settings,
                            body: dict[str, Any] | None = None) -> ChunkStream:
    """Queue the request's jobs and wait a moment for their first events, so that an early failure is a plain
    HTTP error; a request still queued after `sse_queued_after_s` gets its stream at once (`: queued`, then
    keep-alives) and any failure from then on as an error chunk. With the request's `body` it is resumable."""
    request_id = new_request_id()
    api = "chat" if isinstance(request, ChatRequest) else "completion"
    started = await start_stream(broker, registry, request, settings, request_id=request_id,
                                 resumable=(api, _response_id(request, request_id), body) if body else None)
    stream = chunk_stream(broker, request, settings, started.request_events, request_id, started.created,
                          started.reply_format, started.priming)
    stream.resumable(broker.streams, started.stream_id)
    return stream


def chunk_stream(broker: Broker, request: GenerateBody, settings: Settings, request_events: RequestEvents, request_id: str,
                 created: float, form: str, priming: asyncio.Task[None] | None = None) -> ChunkStream:
    """The OpenAI chunks of a request's events (a new request, or a resumed one from its journal's start)."""
    header = ChunkHeader(_response_id(request, request_id), int(created), request.params.model,
                         request.params.include_usage)
    return ChunkStream(request_events, header, chat=isinstance(request, ChatRequest),
                       logprobs=_wants_logprobs(request), tools=_uses_tools(request), timings=request.params.timings,
                       reasoning=_uses_reasoning(request), reply_format=form,
                       errors=broker.errors, priming=priming, keepalive_s=settings.sse_keepalive_s,
                       reasoning_keys=reasoning_keys(settings.reasoning_fields))


async def run_embeddings(broker: Broker, request: EmbedBody, settings: Settings) -> dict[str, Any]:
    """Queue one embed job and turn its DoneEvent into an embeddings list."""
    request_id, now, started = new_request_id(), time.time(), time.monotonic()
    stream = await broker.submit(build_embed_job(request, settings, request_id, now), keep_alive=request.keep_alive)
    note_request().request_id = request_id
    try:
        async for event in stream:
            if isinstance(event, ErrorEvent):
                raise LLMFleetError.from_event(event)
            if isinstance(event, DoneEvent):
                vectors = event.embeddings or []
                if len(vectors) != len(request.inputs):
                    raise InternalError(f"the worker returned {len(vectors)} embeddings for {len(request.inputs)} inputs")
                broker.metrics.embedding_done(request.model, event.usage, started)
                key = current_key.get()
                if key is not None:
                    await charge_key(broker, key, event.usage.total_tokens)
                return bodies.embedding_list(request.model, vectors, event.usage, request.encoding_format)
        raise InternalError("the event stream ended without a terminal event")
    finally:
        await RequestEvents([stream], 1).close()
