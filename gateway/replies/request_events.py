"""The merged events of one request's generate jobs (one job per prompt), with global choice indexes.

Choice i of prompt p becomes index p * n + i, as OpenAI numbers the choices of a multi-prompt
completion. A worker's ErrorEvent becomes the matching LLMFleetError; the usage of every DoneEvent is
summed. close() cancels every job that has not finished and is safe to call from a `finally` of a task
that is being cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import anyio
from redis.exceptions import RedisError

from gateway.cluster.broker import Broker
from gateway.cluster.event_stream import EventStream, JobRef
from gateway.cluster.metrics import RequestTracker
from gateway.http.api_keys import KeyRecord, current_key
from shared.errors import InternalError, LLMFleetError
from shared.messages import (
    ChoiceEndEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    GenerateJob,
    Timing,
    TokenEvent,
    Usage,
)

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0

ChoiceEvent = TokenEvent | ChoiceEndEvent
STILL_WAITING = object()  # next_within: no event within the time given


async def charge_key(broker: Broker, key: KeyRecord, tokens: int) -> None:
    """Charge a finished request's tokens to its API key (metrics, and its tokens-per-minute limit)."""
    broker.metrics.key_tokens.labels(key.name).inc(tokens)
    try:
        await broker.limiter.charge_tokens(key, tokens)
    except (RedisError, OSError) as exc:  # the request already ended; losing one charge is better than failing it
        log.warning("could not charge %d tokens to key %s: %s", tokens, key.name, type(exc).__name__)


class RequestEvents:
    """Events of several jobs as one sequence of (global choice index, token or choice-end event)."""

    def __init__(self, streams: list[EventStream], n: int, tracker: RequestTracker | None = None) -> None:
        self._streams = streams
        self._tracker = tracker
        self._key: KeyRecord | None = None  # the API key the request came with (its tokens are charged to it)
        self._broker: Broker | None = None
        self._n = n
        self._open = len(streams)
        self._buffer: deque[tuple[int, Event]] = deque()
        self._queue: asyncio.Queue[tuple[int, Event | LLMFleetError]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._waiting: asyncio.Future[tuple[int, ChoiceEvent] | None] | None = None  # next_within's pending next()
        if len(streams) > 1:
            self._tasks = [asyncio.create_task(self._pump(i, s)) for i, s in enumerate(streams)]
        self.usage = Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
        self.timings: list[Timing] = []  # one per job that finished with the worker's timing

    @property
    def choices(self) -> int:
        """How many choices the request has in all."""
        return self._n * len(self._streams)

    @property
    def buffered(self) -> bool:
        """True when the next event can be had without waiting."""
        if self._buffer:
            return True
        return not self._queue.empty() if self._tasks else self._streams[0].buffered

    @classmethod
    async def start(cls, broker: Broker, jobs: list[GenerateJob], *, keep_alive: float | None = None) -> RequestEvents:
        """Submit every job (with the request's keep_alive, if any); if one cannot be queued, cancel the ones
        that were and re-raise."""
        streams: list[EventStream] = []
        try:
            for job in jobs:
                streams.append(await broker.submit(job, keep_alive=keep_alive))
        except BaseException:
            await cls(streams, 1).close()
            raise
        request_events = cls(streams, jobs[0].n, broker.metrics.track(jobs[0].model))
        request_events._key, request_events._broker = current_key.get(), broker
        return request_events

    @classmethod
    async def follow(cls, broker: Broker, jobs: list[JobRef], n: int) -> RequestEvents:
        """The events of jobs already queued (a resumed stream), each from its journal's first one; the request's
        API key (the resuming client's, which must be the same) is charged if this stream is the one that ends."""
        streams: list[EventStream] = []
        try:
            for job in jobs:
                streams.append(await broker.follow(job))
        except BaseException:
            await cls(streams, 1).close(cancel=False)
            raise
        request_events = cls(streams, n)
        request_events._key, request_events._broker = current_key.get(), broker
        return request_events

    def retain(self) -> None:
        """Keep the jobs' journals LLMFLEET_STREAM_RETENTION_S after they end (a resumable stream)."""
        for stream in self._streams:
            stream.retain = True

    async def prime(self) -> None:
        """Wait for the first event of every job; raise a job's error if it failed before it started."""
        seen: set[int] = set()
        try:
            while len(seen) < len(self._streams):
                job, event = await self._receive()
                self._raise_error(event)
                seen.add(job)
                self._buffer.append((job, event))
        except LLMFleetError as exc:
            self.failed(exc)
            raise

    async def next(self) -> tuple[int, ChoiceEvent] | None:
        """The next token or choice-end event with its global choice index; None once every job is done."""
        try:
            return await self._next()
        except LLMFleetError as exc:
            self.failed(exc)
            raise

    async def next_within(self, timeout_s: float) -> tuple[int, ChoiceEvent] | None | object:
        """next(), or STILL_WAITING when nothing came within `timeout_s` (the wait goes on at the next call): a
        stream sends a keep-alive then (a failover's resume, a Redis pause, a long prefill)."""
        if self._waiting is None:
            self._waiting = asyncio.ensure_future(self.next())
        done, _ = await asyncio.wait({self._waiting}, timeout=timeout_s)
        if not done:
            return STILL_WAITING
        finished, self._waiting = self._waiting, None
        return finished.result()

    async def _next(self) -> tuple[int, ChoiceEvent] | None:
        while self._open:
            job, event = self._buffer.popleft() if self._buffer else await self._receive()
            self._raise_error(event)
            if isinstance(event, DoneEvent):
                self._add_usage(event.usage)
                if event.timing is not None:
                    self.timings.append(event.timing)
                self._open -= 1
                if self._tracker is not None:
                    self._tracker.job_done(event.timing)
                continue
            if not isinstance(event, TokenEvent | ChoiceEndEvent) or event.index >= self._n:
                raise InternalError(f"a worker sent an unexpected event for request {event.id}")
            if self._tracker is not None:
                if isinstance(event, ChoiceEndEvent):
                    self._tracker.choice_ended(event.finish_reason)
                elif not event.echo:
                    self._tracker.token(len(event.token_ids))
            return job * self._n + event.index, event
        return None

    def failed(self, error: LLMFleetError) -> None:
        """Note the error that ends the request (for the metrics)."""
        if self._tracker is not None:
            self._tracker.failed(error.code)

    async def close(self, *, cancel: bool = True, charge: bool = True) -> None:
        """Cancel unfinished jobs (unless `cancel` is False: they run on for a resume) and stop listening; charge
        the API key (unless `charge` is False: another stream of the request does); shielded, bounded in time."""
        if self._tracker is not None:
            self._tracker.close(self.usage, complete=self._open == 0)
            self._tracker = None
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            if charge and self._key is not None and self._broker is not None:
                await charge_key(self._broker, self._key, self.usage.total_tokens)
                self._key = None
            tasks = self._tasks + ([self._waiting] if self._waiting is not None else [])
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in self._streams:
                await stream.close(cancel=cancel)

    async def _receive(self) -> tuple[int, Event]:
        if len(self._streams) == 1:
            try:
                return 0, await self._streams[0].__anext__()
            except StopAsyncIteration:
                raise InternalError("the event stream ended without a terminal event") from None
        job, item = await self._queue.get()
        if isinstance(item, LLMFleetError):
            raise item
        return job, item

    async def _pump(self, job: int, stream: EventStream) -> None:
        try:
            async for event in stream:
                self._queue.put_nowait((job, event))
        except LLMFleetError as exc:
            self._queue.put_nowait((job, exc))
        except Exception as exc:  # a bug must fail the request, not hang it
            log.exception("event pump of request %s failed", stream.request_id)
            self._queue.put_nowait((job, InternalError(f"following request {stream.request_id} failed ({type(exc).__name__})")))

    @staticmethod
    def _raise_error(event: Event) -> None:
        if isinstance(event, ErrorEvent):
            error = LLMFleetError.from_event(event)
            log.info("request %s failed in the worker: %s %s", event.id, error.status, error.code)
            raise error

    def _add_usage(self, usage: Usage) -> None:
        self.usage = Usage(
            prompt_tokens=self.usage.prompt_tokens + usage.prompt_tokens,
            completion_tokens=self.usage.completion_tokens + usage.completion_tokens,
            total_tokens=self.usage.total_tokens + usage.total_tokens,
            cached_tokens=self.usage.cached_tokens + usage.cached_tokens,
        )
