"""Reading SSE frames as the gateway writes them: comment lines (`: keep-alive`, one line each, no blank line of
their own: gateway/http/sse.py), an optional `id: n` line, then `event:` / `data:` lines."""

from __future__ import annotations

import re

ID_LINE = re.compile(rb"id: (\d+)\n")


def without_comments(frame: bytes) -> bytes:
    """A frame without the comment lines that came before its event (keep-alives share its block)."""
    while frame.startswith(b":"):
        end = frame.find(b"\n")
        frame = b"" if end < 0 else frame[end + 1:]
    return frame


def split_id(frame: bytes) -> tuple[int | None, bytes]:
    """A frame's event id (None when it has none) and the frame without its comment lines and `id:` line."""
    frame = without_comments(frame)
    match = ID_LINE.match(frame)
    if match is None:
        return None, frame
    return int(match.group(1)), frame[match.end():]


def split_ids(body: str) -> tuple[list[int], list[str]]:
    """The ids and id-less blocks of a whole SSE body (blocks without an id, such as comments, have none)."""
    ids, blocks = [], []
    for block in body.split("\n\n")[:-1]:
        event_id, rest = split_id(block.encode())
        if not rest:
            continue  # comment lines alone (the stream's end)
        if event_id is not None:
            ids.append(event_id)
        blocks.append(rest.decode())
    return ids, blocks
