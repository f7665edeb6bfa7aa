"""Scheduler events to wire events: numbered per request, sealed per step, sent by worker.serve.publish_sender.

A request the runner owns (worker.failover.fencing) has its events and its ack written by one fenced script call per
send, refused if another worker took the request over since; the refused requests are reported by
`take_fenced_off` for the runner to drop. Requests without an owner value (tests, stand-ins) use plain commands.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from redis import Redis

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
from worker.engine.text.stopping import StopReason
from worker.engine.text.tokenizer import Tokenizer
from worker.schedule.prompt_scoring import PromptScored
from worker.schedule.sequences import EmbeddingDone, RequestDone, RequestFailed, SequenceStep
from worker.serve.publish_sender import DEFAULT_MAX_STEPS, BatchSender, RequestWrite, StepBatch

log = logging.getLogger(__name__)
StepEvent = SequenceStep | RequestDone | RequestFailed | EmbeddingDone | PromptScored


class EventPublisher:
    """Numbers every request's events from 0 and seals a step's worth of them for one MULTI/EXEC."""

    def __init__(self, redis: Redis, tokenizer: Tokenizer, journal_ttl_s: float, *, model: str,
                 max_steps: int = DEFAULT_MAX_STEPS) -> None:
        self.redis = redis
        self.model = model  # the worker's (base) model: every request's journal, channel and owner are in its slot
        self.tokenizer = tokenizer
        self.journal_ttl_s = max(1, int(journal_ttl_s))
        self._next_seq: dict[str, int] = {}
        self._pending: list[Event] = []
        self._acks: list[tuple[str, str]] = []  # (stream, entry id) of jobs whose terminal event is queued
        self._owners: dict[str, str] = {}  # request id -> the owner value its writes are fenced with
        self._entries: dict[tuple[str, str], str] = {}  # (stream, entry id) -> request id (ack goes with its write)
        self.sender = BatchSender(redis, self.journal_ttl_s, model=model, max_steps=max_steps)
        self.threaded = False  # True once start() runs the sender in its own thread

    def next_seq(self, request_id: str) -> int:
        """Allocate the next sequence number of a request."""
        seq = self._next_seq.get(request_id, 0)
        self._next_seq[request_id] = seq + 1
        return seq

    def own(self, request_id: str, owner: str, entry: tuple[str, str]) -> None:
        """Fence every later write of a request, and the ack of its job entry (stream, id), with its owner value."""
        self._owners[request_id] = owner
        self._entries[entry] = request_id
        self.sender.allow(request_id)

    def forget(self, request_id: str) -> None:
        """Drop everything queued or known for a request (another worker owns it now)."""
        self._pending = [event for event in self._pending if event.id != request_id]
        self._acks = [ack for ack in self._acks if self._entries.get(ack) != request_id]
        self._entries = {entry: rid for entry, rid in self._entries.items() if rid != request_id}
        self._owners.pop(request_id, None)
        self._next_seq.pop(request_id, None)
        self.sender.drop(request_id)

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
        """Seal every queued event and these acks (jobs whose terminal event is queued) as one step batch.

        With the sender thread started, the batch is sent in the background (one transaction for every batch
        waiting); without it, it is sent now and a failed send raises, keeping everything queued, in order.
        """
        self._acks.extend(acks)
        if self._pending or self._acks:
            self.sender.submit(self._seal())
        if not self.threaded:
            self.sender.send_now()

    def _seal(self) -> StepBatch:
        """The queued events and acks as a batch (owner values as they are now); finished requests forgotten."""
        batch = StepBatch()
        writes: dict[str, RequestWrite] = {}
        for event in self._pending:
            owner = self._owners.get(event.id, "")
            if not owner:
                batch.writes.append(RequestWrite(event.id, "", [event]))
                continue
            if event.id not in writes:
                writes[event.id] = RequestWrite(event.id, owner)
                batch.writes.append(writes[event.id])
            writes[event.id].events.append(event)
        for ack in self._acks:
            request_id = self._entries.pop(ack, None)
            if request_id is not None and request_id in self._owners:
                if request_id not in writes:
                    writes[request_id] = RequestWrite(request_id, self._owners[request_id])
                    batch.writes.append(writes[request_id])
                writes[request_id].ack = ack
            else:
                batch.plain_acks.append(ack)
        for event in self._pending:
            if is_terminal(event):
                self._next_seq.pop(event.id, None)
                self._owners.pop(event.id, None)
        self._pending, self._acks = [], []
        return batch

    def start(self) -> None:
        """Send sealed batches from a background thread from now on (the step loop never waits on Redis)."""
        self.threaded = True
        self.sender.start()

    def room(self, wait_s: float = 0.0) -> bool:
        """Whether another step may be sealed now (see BatchSender.room: the backpressure point)."""
        return self.sender.room(wait_s)

    def take_fenced_off(self) -> list[tuple[str, str]]:
        """(request id, current owner) of requests whose writes were refused since the last call: to drop."""
        return self.sender.take_fenced_off()

    @property
    def fenced_off(self) -> list[tuple[str, str]]:
        """The refused requests not yet taken (a copy)."""
        return self.sender.peek_fenced_off()

    @property
    def backlog(self) -> int:
        """Events and acks waiting to be sent (not yet sealed, queued, or being sent)."""
        return len(self._pending) + len(self._acks) + self.sender.backlog
