"""Scheduler events to wire events: numbered per request, journaled, and published in one round trip.

A request the runner owns (worker.fencing) has its events and its ack written by one fenced script call per
flush, refused if another worker took the request over since; the refused requests are reported in
`fenced_off` for the runner to drop. Requests without an owner value (tests, stand-ins) use plain commands.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError

from shared import codec, keys
from shared.errors import LLMFleetError
from shared.messages import (
    ChoiceEndEvent,
    DoneEvent,
    Event,
    Timing,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
    is_terminal,
)
from worker.engine.stopping import StopReason
from worker.engine.tokenizer import Tokenizer
from worker.fencing import is_noscript, load_scripts, queue_fenced_publish
from worker.prompt_scoring import PromptScored
from worker.sequences import EmbeddingDone, RequestDone, RequestFailed, SequenceStep
from worker.wire_commands import queue_event, queue_job_done

log = logging.getLogger(__name__)
StepEvent = SequenceStep | RequestDone | RequestFailed | EmbeddingDone | PromptScored


class EventPublisher:
    """Numbers every request's events from 0 and sends a step's worth of them in one MULTI/EXEC."""

    def __init__(self, redis: Redis, tokenizer: Tokenizer, journal_ttl_s: float) -> None:
        self.redis = redis
        self.tokenizer = tokenizer
        self.journal_ttl_s = max(1, int(journal_ttl_s))
        self._next_seq: dict[str, int] = {}
        self._pending: list[Event] = []
        self._acks: list[tuple[str, str]] = []  # (stream, entry id) of jobs whose terminal event is queued
        self._owners: dict[str, str] = {}  # request id -> the owner value its writes are fenced with
        self._entries: dict[tuple[str, str], str] = {}  # (stream, entry id) -> request id (ack goes with its write)
        self.fenced_off: list[tuple[str, str]] = []  # (request id, current owner): refused writes, to drop

    def next_seq(self, request_id: str) -> int:
        """Allocate the next sequence number of a request."""
        seq = self._next_seq.get(request_id, 0)
        self._next_seq[request_id] = seq + 1
        return seq

    def own(self, request_id: str, owner: str, entry: tuple[str, str]) -> None:
        """Fence every later write of a request, and the ack of its job entry (stream, id), with its owner value."""
        self._owners[request_id] = owner
        self._entries[entry] = request_id

    def forget(self, request_id: str) -> None:
        """Drop everything queued or known for a request (another worker owns it now)."""
        self._pending = [event for event in self._pending if event.id != request_id]
        self._acks = [ack for ack in self._acks if self._entries.get(ack) != request_id]
        self._entries = {entry: rid for entry, rid in self._entries.items() if rid != request_id}
        self._owners.pop(request_id, None)
        self._next_seq.pop(request_id, None)

    def resume_from(self, request_id: str, seq: int) -> None:
        """Continue a request's numbering at seq (a job reclaimed from a dead worker)."""
        self._next_seq[request_id] = seq

    def _logprobs(self, step: SequenceStep) -> list[TokenLogprob] | None:
        """The wire form of one step's logprobs, or None when the request asked for none."""
        out = step.output
        if out.logprob is None:
            return None
        return [TokenLogprob(token_id=out.token_id, token=self._text(out.token_id), logprob=out.logprob,
                             bytes=list(self.tokenizer.token_bytes(out.token_id)), top=self._top(out.top_logprobs))]

    def _top(self, alternatives: list[tuple[int, float]]) -> list[TopLogprob]:
        return [TopLogprob(token_id=t, token=self._text(t), logprob=lp, bytes=list(self.tokenizer.token_bytes(t)))
                for t, lp in alternatives]

    def add_echo(self, scored: PromptScored) -> None:
        """Queue the prompt echo of every choice, with the prompt tokens' logprobs (the first one's is None)."""
        text = self.tokenizer.decode(scored.prompt_ids, skip_special=False)
        logprobs = [TokenLogprob(token_id=s.token_id, token=self._text(s.token_id), logprob=s.logprob,
                                 bytes=list(self.tokenizer.token_bytes(s.token_id)), top=self._top(s.top))
                    for s in scored.scores]
        for index in range(scored.n):
            self._pending.append(TokenEvent(id=scored.request_id, seq=self.next_seq(scored.request_id), index=index,
                                            text=text, token_ids=list(scored.prompt_ids), logprobs=logprobs,
                                            echo=True))

    def _text(self, token_id: int) -> str:
        """A token's own text (bytes decoded with replacement; the exact bytes travel beside it)."""
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    def add_steps(self, events: Iterable[StepEvent]) -> list[str]:
        """Queue the wire events of one scheduler step; returns the ids of requests that ended."""
        ended = []
        for event in events:
            if isinstance(event, SequenceStep):
                out = event.output
                self._pending.append(TokenEvent(id=event.request_id, seq=self.next_seq(event.request_id),
                                                index=event.index, text=out.text, token_ids=[out.token_id],
                                                logprobs=self._logprobs(event)))
                if out.finish_reason is not None:
                    self._pending.append(ChoiceEndEvent(id=event.request_id, seq=self.next_seq(event.request_id),
                                                        index=event.index, finish_reason=out.finish_reason,
                                                        stop_sequence=out.stop_sequence))
            elif isinstance(event, PromptScored):
                self.add_echo(event)
            elif isinstance(event, RequestDone):
                self.add_done(event)
                ended.append(event.request_id)
            elif isinstance(event, EmbeddingDone):
                usage = Usage(prompt_tokens=event.prompt_tokens, completion_tokens=0, total_tokens=event.prompt_tokens)
                self._pending.append(DoneEvent(id=event.request_id, seq=self.next_seq(event.request_id), usage=usage,
                                               embeddings=event.embeddings))
                ended.append(event.request_id)
            else:
                self.add_error(event.request_id, LLMFleetError(event.message))
                ended.append(event.request_id)
        return ended

    def add_done(self, done: RequestDone) -> None:
        """Queue the terminal DoneEvent (after ChoiceEnd events for choices cut short (cancelled) or ended
        without a token (a scored prompt with max_tokens 0))."""
        rid = done.request_id
        for index, (reason, tail) in enumerate(zip(done.finish_reasons, done.tail_texts or [""] * len(done.finish_reasons))):
            if reason == StopReason.CANCELLED or done.unsampled:
                if tail:
                    self._pending.append(TokenEvent(id=rid, seq=self.next_seq(rid), index=index, text=tail))
                self._pending.append(ChoiceEndEvent(id=rid, seq=self.next_seq(rid), index=index,
                                                    finish_reason="cancelled" if reason == StopReason.CANCELLED
                                                    else "length"))
        t = done.timings
        timing = None
        if t.finished is not None:
            timing = Timing(queue_s=t.queue_s or 0.0, first_token_s=t.ttft_s or 0.0, total_s=t.finished - t.arrived)
        usage = Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                      total_tokens=done.prompt_tokens + done.completion_tokens, cached_tokens=done.cached_tokens)
        self._pending.append(DoneEvent(id=rid, seq=self.next_seq(rid), usage=usage, timing=timing))

    def add_event(self, event: Event) -> None:
        """Queue an already-built event (its seq must come from next_seq)."""
        self._pending.append(event)

    def add_error(self, request_id: str, error: LLMFleetError) -> None:
        """Queue a terminal ErrorEvent."""
        self._pending.append(error.to_event(request_id, self.next_seq(request_id)))

    def flush(self, acks: list[tuple[str, str]] = ()) -> None:
        """Journal and publish every queued event, and ack (+ delete) finished jobs, in one transaction.

        If the transaction fails (Redis away), nothing is dropped: the events and acks stay queued, in
        order, and the next flush sends them with whatever came since; the error propagates to the caller.
        A fenced write that Redis could not run (NOSCRIPT: it restarted and forgot the script) stays queued
        too, after the script is loaded again; a refused one (stale owner) is dropped and reported.
        """
        self._acks.extend(acks)
        if not self._pending and not self._acks:
            return
        pipe = self.redis.pipeline(transaction=True)
        fenced = self._queue_commands(pipe)
        results = pipe.execute(raise_on_error=False)  # a lost connection raises: everything is kept for a retry
        kept: set[str] = set()
        refused = []
        for index, request_id in fenced:
            result = results[index]
            if is_noscript(result):
                kept.add(request_id)
            elif isinstance(result, ResponseError):
                refused.append(result)
            elif result != 1:  # another worker took the request over: the runner drops it
                self.fenced_off.append((request_id, result.decode() if isinstance(result, bytes) else str(result)))
        fenced_at = {index for index, _ in fenced}
        refused += [r for i, r in enumerate(results) if isinstance(r, ResponseError) and i not in fenced_at]
        if refused:  # Redis ran the transaction but refused some commands (e.g. WRONGTYPE); retrying cannot
            # help and would repeat the rest, so they are logged and dropped
            log.warning("Redis refused %d of %d commands of a publish (%s)", len(refused), len(results), refused[0])
        self._settle(kept)
        if kept:
            log.warning("Redis lost the fencing scripts (restarted?); loading them again")
            load_scripts(self.redis)

    def _queue_commands(self, pipe: Any) -> list[tuple[int, str]]:
        """Queue every pending write; returns (command index, request id) of each fenced script call."""
        groups: dict[str, list[Event]] = {}
        for event in self._pending:
            if event.id in self._owners:
                groups.setdefault(event.id, []).append(event)
            else:  # not fenced: plain commands
                queue_event(pipe, event.id, event.seq, codec.encode_event(event), journal_ttl_s=self.journal_ttl_s,
                            refresh_ttl=event.seq == 0 or is_terminal(event))
        bound: dict[str, tuple[str, str]] = {}
        for stream, entry_id in self._acks:
            request_id = self._entries.get((stream, entry_id))
            if request_id in self._owners:
                bound[request_id] = (stream, entry_id)
                groups.setdefault(request_id, [])
            else:
                queue_job_done(pipe, stream, entry_id)
        fenced = []
        for request_id, events in groups.items():
            stream, entry_id = bound.get(request_id, (keys.journal_stream(request_id), ""))
            fenced.append((len(pipe.command_stack), request_id))
            queue_fenced_publish(pipe, request_id, self._owners[request_id],
                                 [(e.seq, codec.encode_event(e)) for e in events], ttl_s=self.journal_ttl_s,
                                 refresh_ttl=any(e.seq == 0 or is_terminal(e) for e in events), stream=stream,
                                 ack_id=entry_id or None)
        return fenced

    def _settle(self, kept: set[str]) -> None:
        """After a transaction ran: keep what must be retried (`kept` requests), forget what was written."""
        for request_id, _owner in self.fenced_off:
            self.forget(request_id)
        written = [event for event in self._pending if event.id not in kept]
        acked = [ack for ack in self._acks if self._entries.get(ack) not in kept]
        self._pending = [event for event in self._pending if event.id in kept]
        self._acks = [ack for ack in self._acks if self._entries.get(ack) in kept]
        for event in written:
            if is_terminal(event):
                self._next_seq.pop(event.id, None)
                self._owners.pop(event.id, None)
        for ack in acked:
            self._entries.pop(ack, None)

    @property
    def backlog(self) -> int:
        """Events and acks waiting for a successful flush."""
        return len(self._pending) + len(self._acks)
