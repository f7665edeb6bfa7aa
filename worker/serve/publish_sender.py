"""Sends the worker's sealed step writes to Redis: one MULTI/EXEC per send, in step order, off the step path.

The runner seals each step's events and acks into a StepBatch (worker.serve.publisher) and hands it over; a sender
thread sends everything queued since its last send in ONE transaction, so under Redis latency decoding goes on
and publishing catches up several steps per round trip. `room()` is False once `max_steps` steps wait unsent:
the only point where the step loop waits on Redis (backpressure). This transaction is the single place where
per-step Redis work is batched: whatever a step must send or check joins it here (_queue_commands).

Nothing is dropped on a failed send (connection lost): the batches stay, in order, ahead of later ones. A fenced
write Redis could not run (NOSCRIPT) stays too, after the scripts are loaded again; a refused one (another
worker owns the request) is dropped with every later write of that request and reported by `take_fenced_off`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from shared import codec, keys
from shared.messages import Event, is_terminal
from shared.redis_commands import queue_event, queue_job_done, reply_text, write_refusal
from worker.failover.fencing import is_noscript, load_scripts, queue_fenced_publish

log = logging.getLogger(__name__)
Entry = tuple[str, str]  # (job stream, entry id)
DEFAULT_MAX_STEPS = 64  # sealed steps that may wait unsent before the step loop waits (backpressure)


class _Refused(Exception):
    """Redis refused some of a publish's scripts (it answered: OOM, READONLY, MISCONF): what to send again."""

    def __init__(self, kept: StepBatch, error: ResponseError) -> None:
        super().__init__(str(error))
        self.kept, self.error = kept, error


@dataclass
class RequestWrite:
    """One request's part of a step: its events in order, fenced with `owner` ("" = plain commands), and the
    ack of its job entry when its terminal event is among them (fenced requests only)."""

    request_id: str
    owner: str
    events: list[Event] = field(default_factory=list)
    ack: Entry | None = None


@dataclass
class StepBatch:
    """What one step (or several merged ones) sends: per-request writes in order, then the plain acks."""

    writes: list[RequestWrite] = field(default_factory=list)
    plain_acks: list[Entry] = field(default_factory=list)
    steps: int = 1  # how many sealed steps this holds (the bound counts steps)

    @property
    def size(self) -> int:
        """Events and acks it holds."""
        return sum(len(w.events) + (w.ack is not None) for w in self.writes) + len(self.plain_acks)


def merge(batches: list[StepBatch]) -> StepBatch:
    """Batches in step order as one: each (request, owner)'s events joined in order, acks kept."""
    merged = StepBatch(steps=0)
    by_key: dict[tuple[str, str], RequestWrite] = {}
    for batch in batches:
        merged.steps += batch.steps
        merged.plain_acks += batch.plain_acks
        for write in batch.writes:
            if not write.owner:
                merged.writes.append(write)  # plain: each write stays as it is
                continue
            into = by_key.get((write.request_id, write.owner))
            if into is None:
                into = by_key[(write.request_id, write.owner)] = RequestWrite(write.request_id, write.owner)
                merged.writes.append(into)
            into.events += write.events
            into.ack = write.ack or into.ack
    return merged


class BatchSender:
    """Holds sealed step batches and sends them, in order, one transaction per send (thread or caller)."""

    def __init__(self, redis: Redis, journal_ttl_s: int, *, model: str, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        self.redis = redis
        self.model = model  # every write's names carry its hash tag: one transaction stays in one cluster slot
        self.journal_ttl_s = journal_ttl_s
        self.max_steps = max_steps
        self._queued: list[StepBatch] = []  # oldest first; a failed send puts its batch back at the front
        self._in_flight = 0  # steps being sent now
        self._in_flight_size = 0  # their events and acks
        self._fenced_off: list[tuple[str, str]] = []  # (request id, current owner): refused, for the runner
        self._dropped: set[str] = set()  # requests whose writes are dropped (fenced off, forgotten)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._failures = 0
        self.sends = 0  # transactions sent (round trips)

    # ---- the runner's side -----------------------------------------------------------------------------

    def submit(self, batch: StepBatch) -> None:
        """Queue a sealed batch behind everything earlier (never blocks: callers check room() first)."""
        with self._cond:
            self._queued.append(batch)
            self._cond.notify_all()

    def room(self, wait_s: float = 0.0) -> bool:
        """Whether another step may be sealed (fewer than max_steps wait); waits up to wait_s for room."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._waiting_steps() >= self.max_steps:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def drop(self, request_id: str) -> None:
        """Drop every queued write of a request (another worker owns it now); later ones are dropped too."""
        with self._cond:
            self._dropped.add(request_id)
            for batch in self._queued:
                batch.writes = [w for w in batch.writes if w.request_id != request_id]

    def allow(self, request_id: str) -> None:
        """Let a request's writes through again (this worker owns it anew)."""
        with self._cond:
            self._dropped.discard(request_id)

    def take_fenced_off(self) -> list[tuple[str, str]]:
        """(request id, current owner) of the writes refused since the last call."""
        with self._cond:
            out, self._fenced_off = self._fenced_off, []
            return out

    def peek_fenced_off(self) -> list[tuple[str, str]]:
        """The refused writes not yet taken (a copy)."""
        with self._cond:
            return list(self._fenced_off)

    @property
    def backlog(self) -> int:
        """Events and acks queued or being sent."""
        with self._cond:
            return sum(b.size for b in self._queued) + (self._in_flight_size if self._in_flight else 0)

    def _waiting_steps(self) -> int:
        return sum(b.steps for b in self._queued) + self._in_flight

    # ---- sending -----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Send from a background thread from now on."""
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float) -> bool:
        """Send what is queued (up to timeout_s), then stop the thread; True if nothing was left unsent."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._queued or self._in_flight) and self._thread is not None and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            self._stop = True
            self._cond.notify_all()
            left = bool(self._queued or self._in_flight)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if left:
            log.warning("publisher stopped with %d events and acks unsent (their jobs resume elsewhere)", self.backlog)
        return not left

    def wait_sent(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or being sent (tests, draining); True if so."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queued or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(0.1, left))
            return True

    def send_now(self) -> None:
        """Send everything queued in one transaction from the caller's thread; raises RedisError when it
        cannot be sent (everything stays queued, in order)."""
        with self._cond:
            if not self._queued:
                return
            batch = merge(self._queued)
            self._queued = []
            self._in_flight, self._in_flight_size = batch.steps, batch.size
        kept: StepBatch | None = batch
        try:
            kept = self._send(batch)
        except _Refused as refused:  # Redis refused writes (OOM, READONLY, MISCONF): they wait for the retry
            kept = refused.kept
            raise refused.error from None
        finally:
            with self._cond:
                if kept is not None and (kept.writes or kept.plain_acks):
                    self._queued.insert(0, kept)
                self._in_flight = 0
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._stop:
                    self._cond.wait()
                if self._stop and not self._queued:
                    return
            try:
                self.send_now()
                self._failures = 0
            except RedisError as exc:
                self._failures += 1
                if self._failures == 1 or self._failures % 10 == 0:
                    log.warning("publishing failed (%s); %d events and acks kept for the retry", exc, self.backlog)
                with self._cond:
                    if not self._stop:
                        self._cond.wait(min(2.0, 0.05 * 2 ** (self._failures - 1)))
                    elif self._failures > 3:
                        return  # stopping and Redis is away: close() reports what is left
            except Exception:
                log.exception("unexpected error while publishing; retrying")
                time.sleep(0.5)

    def _send(self, batch: StepBatch) -> StepBatch | None:
        """One transaction for the batch; returns what must be sent again (NOSCRIPT), or None."""
        with self._cond:
            dropped = set(self._dropped)
        batch.writes = [w for w in batch.writes if w.request_id not in dropped]
        if not batch.writes and not batch.plain_acks:
            return None
        pipe = self.redis.pipeline(transaction=True)
        fenced = self._queue_commands(pipe, batch)
        results = pipe.execute(raise_on_error=False)  # a lost connection raises: the caller keeps the batch
        self.sends += 1
        kept = StepBatch(steps=0)
        refused = []
        refusal: ResponseError | None = None
        for index, write in fenced:
            result = results[index]
            if is_noscript(result):
                kept.writes.append(write)
            elif isinstance(result, ResponseError) and write_refusal(result) is not None:
                kept.writes.append(write)  # the script wrote nothing: sent again, in order, once Redis accepts
                refusal = result
            elif isinstance(result, ResponseError):
                refused.append(result)
            elif result != 1:  # another worker took the request over: the runner drops it
                owner = reply_text(result)
                with self._cond:
                    self._fenced_off.append((write.request_id, owner))
                    self._dropped.add(write.request_id)
        fenced_at = {index for index, _ in fenced}
        refused += [r for i, r in enumerate(results) if isinstance(r, ResponseError) and i not in fenced_at]
        if refused:  # Redis ran the transaction but refused some commands (e.g. WRONGTYPE); retrying cannot
            # help and would repeat the rest, so they are logged and dropped
            log.warning("Redis refused %d of %d commands of a publish (%s)", len(refused), len(results), refused[0])
        if refusal is not None:
            raise _Refused(kept, refusal)
        if kept.writes:
            log.warning("Redis lost the fencing scripts (restarted?); loading them again")
            load_scripts(self.redis)
            return kept
        return None

    def _queue_commands(self, pipe: Any, batch: StepBatch) -> list[tuple[int, RequestWrite]]:
        """Queue every write of the batch; returns (command index, write) of each fenced script call."""
        fenced = []
        for write in batch.writes:
            if write.owner:
                continue
            for event in write.events:  # not fenced: plain commands
                queue_event(pipe, self.model, event.id, event.seq, codec.encode_event(event), journal_ttl_s=self.journal_ttl_s,
                            refresh_ttl=event.seq == 0 or is_terminal(event))
        for stream, entry_id in batch.plain_acks:
            queue_job_done(pipe, stream, entry_id)
        for write in batch.writes:
            if not write.owner:
                continue
            stream, entry_id = write.ack or (keys.journal_stream(self.model, write.request_id), "")
            fenced.append((len(pipe.command_stack), write))
            queue_fenced_publish(pipe, self.model, write.request_id, write.owner,
                                 [(e.seq, codec.encode_event(e)) for e in write.events], ttl_s=self.journal_ttl_s,
                                 refresh_ttl=any(e.seq == 0 or is_terminal(e) for e in write.events),
                                 stream=stream, ack_id=entry_id or None)
        return fenced
