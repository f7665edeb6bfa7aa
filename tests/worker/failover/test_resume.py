"""Reading a request's journal for a resume: progress per choice, and what an unusable journal still tells."""

from __future__ import annotations

import fakeredis
import pytest

from shared import codec, keys
from shared.messages import ChoiceEndEvent, TokenEvent
from worker.failover.resume import JournalUnusable, read_journal


def _append(client: fakeredis.FakeRedis, event: TokenEvent | ChoiceEndEvent) -> None:
    client.xadd(keys.journal_stream("m", "r"), {"seq": str(event.seq), "event": codec.encode_event(event)})


def test_progress_per_choice_and_duplicates_skipped() -> None:
    client = fakeredis.FakeRedis()
    for event in [TokenEvent(id="r", seq=0, index=0, text="a", token_ids=[5]),
                  TokenEvent(id="r", seq=1, index=1, text="b", token_ids=[6]),
                  TokenEvent(id="r", seq=1, index=1, text="b", token_ids=[6]),  # a replayed write
                  ChoiceEndEvent(id="r", seq=2, index=0, finish_reason="stop")]:
        _append(client, event)
    state = read_journal(client, "m", "r")
    assert (state.next_seq, state.tokens, state.ended, state.terminal) == (3, {0: [5], 1: [6]}, {0}, False)


def test_a_gapped_or_unreadable_journal_still_names_the_next_seq() -> None:
    """An error sent after it must not reuse a seq the client already saw (the gateway would drop it)."""
    client = fakeredis.FakeRedis()
    _append(client, TokenEvent(id="r", seq=0, text="a", token_ids=[5]))
    _append(client, TokenEvent(id="r", seq=4, text="b", token_ids=[6]))
    with pytest.raises(JournalUnusable) as gap:
        read_journal(client, "m", "r")
    assert gap.value.next_seq == 5
    client.xadd(keys.journal_stream("m", "r"), {"seq": "7", "event": b"\xff not msgpack"})
    with pytest.raises(JournalUnusable) as unreadable:
        read_journal(client, "m", "r")
    assert unreadable.value.next_seq == 8
