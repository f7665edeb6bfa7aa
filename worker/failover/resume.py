"""What a replacement worker needs to continue a stream invisibly, read from the request's journal.

A journal is the request's events in seq order (journal-then-publish, in one transaction, so the journal
holds at least what any client saw). Resume needs, per choice: the generated token ids already sent (echo
events excluded), whether the choice already ended, and the next seq. A sampled (non-greedy) choice has
drawn exactly one uniform per generated token (Sampler.next_uniform), so the draw count is the token count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from redis import Redis

from shared import codec, keys
from shared.codec import WireFormatError
from shared.messages import ChoiceEndEvent, TokenEvent, is_terminal

log = logging.getLogger(__name__)


@dataclass
class JournalState:
    """A request's progress as its journal records it."""

    next_seq: int = 0
    tokens: dict[int, list[int]] = field(default_factory=dict)  # choice index -> generated ids already sent
    ended: set[int] = field(default_factory=set)  # choices whose ChoiceEndEvent was sent
    echoed: bool = False  # the prompt echo was sent
    terminal: bool = False  # a DoneEvent or ErrorEvent was sent: nothing is left to do


class JournalUnusable(Exception):
    """The journal cannot be trusted for a resume (trimmed, gapped or unreadable).

    `next_seq` is one past the highest seq it records, so an error event sent next is not taken for a
    duplicate by the gateway (which drops every seq it has already seen)."""

    def __init__(self, message: str, next_seq: int) -> None:
        super().__init__(message)
        self.next_seq = next_seq


def read_journal(redis: Redis, model: str, request_id: str) -> JournalState:
    """Replay the journal of a request of `model` into a JournalState, or raise JournalUnusable."""
    state = JournalState()
    entries = redis.xrange(keys.journal_stream(model, request_id))
    event_field, seq_field = keys.JOURNAL_EVENT_FIELD.encode(), keys.JOURNAL_SEQ_FIELD.encode()
    highest = max((_seq(fields.get(seq_field)) for _entry, fields in entries), default=-1)
    for _entry, fields in entries:
        try:
            event = codec.decode_event(fields[event_field])
        except (WireFormatError, KeyError) as exc:
            raise JournalUnusable(f"an unreadable journal entry ({exc})", highest + 1) from None
        if event.seq < state.next_seq:
            continue  # a duplicate
        if event.seq != state.next_seq:
            raise JournalUnusable(f"the journal jumps from seq {state.next_seq - 1} to {event.seq}",
                                  max(highest, event.seq) + 1)
        state.next_seq += 1
        if isinstance(event, TokenEvent):
            if event.echo:
                state.echoed = True
            else:
                state.tokens.setdefault(event.index, []).extend(event.token_ids)
        elif isinstance(event, ChoiceEndEvent):
            state.ended.add(event.index)
        elif is_terminal(event):
            state.terminal = True
    return state


def _seq(value: bytes | None) -> int:
    """A journal entry's seq field (-1 when missing or unreadable)."""
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1
