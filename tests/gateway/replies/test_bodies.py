"""Legacy completion logprobs: text_offset counts characters of the returned text, across events."""

from __future__ import annotations

from gateway.replies.bodies import TextOffsets, completion_logprobs
from shared.messages import TokenLogprob


def entry(piece: bytes, logprob: float | None = -1.0) -> TokenLogprob:
    return TokenLogprob(token_id=0, token=piece.decode("utf-8", errors="replace"), logprob=logprob, bytes=list(piece))


def test_a_character_split_over_two_tokens_is_counted_once_at_its_start() -> None:
    offsets = TextOffsets()
    echo = completion_logprobs([entry(b"caf", None), entry("é".encode()[:1]), entry("é".encode()[1:] + b" ")],
                               offsets)
    assert echo["text_offset"] == [0, 3, 3] and echo["token_logprobs"][0] is None and echo["top_logprobs"][0] is None
    later = completion_logprobs([entry("日".encode()), entry(b"!")], offsets)  # the next event goes on from there
    assert later["text_offset"] == [5, 6]
