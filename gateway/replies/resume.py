"""Resuming a stream on any gateway: the client names the stream (its chat completion, completion, message or
response id) and the last event it got (`Last-Event-ID`, or `?starting_after=N`); the gateway reads the stream's
record (gateway/cluster/streams.py), takes it over (so its job is not cancelled as an orphan), follows its job from
the journal's first event on, renders the same SSE events again with the same numbers, and sends those after N,
then the rest live. The rendering is a pure function of the request and the events, so nothing is sent twice or
skipped. A stream that is gone (ended longer than LLMFLEET_STREAM_RETENTION_S ago, never made, or lost with a Redis
restart) is a 404 `stream_not_found` in the API's own error shape, never a silent wait.
"""

from __future__ import annotations

from starlette.requests import Request

from gateway.cluster.broker import Broker
from gateway.cluster.event_stream import JobRef
from gateway.cluster.streams import CANCELLED, DONE, StreamRecord
from gateway.http.api_keys import current_key
from gateway.http.error_log import note_request
from gateway.http.redis_errors import redis_unavailable
from gateway.replies.request_events import RequestEvents
from shared import keys
from shared.errors import InvalidRequest, StreamNotFound


def last_event_id(request: Request) -> int:
    """The last event the client got: the `Last-Event-ID` header, or `starting_after` / `last_event_id` in the
    query; -1 (from the start) when none is given."""
    raw = request.headers.get("last-event-id") or request.query_params.get("starting_after") \
        or request.query_params.get("last_event_id")
    if raw is None or not raw.strip():
        return -1
    try:
        after = int(raw.strip())
    except ValueError:
        after = -2
    if after < -1:
        raise InvalidRequest(f"Last-Event-ID / starting_after must be an event id (an integer >= 0), not {raw!r}.",
                             param="starting_after")
    return after


async def reopen(broker: Broker, stream_id: str, apis: tuple[str, ...], after: int) -> StreamRecord:
    """The record of a stream to resume (this gateway owns it from now on, unless it is a background response's
    or it ended); StreamNotFound when it cannot be resumed."""
    gone = (f"No stream '{stream_id}' can be resumed: it ended more than "
            f"{broker.settings.stream_retention_s:g}s ago, was never streamed, or its events were lost (a Redis "
            "restart); send the request again.")
    loaded = await broker.streams.load(stream_id)
    key = current_key.get()
    if loaded is None or loaded[0].api not in apis or loaded[0].key != (key.name if key is not None else None):
        raise StreamNotFound(gone)
    record, owner = loaded
    if owner == CANCELLED:
        raise StreamNotFound(f"Stream '{stream_id}' was cancelled: nobody resumed it within "
                             f"{broker.settings.orphan_grace_s:g}s.")
    with redis_unavailable(broker.settings.retry_after_s):
        journals = await broker.redis.exists(*(keys.journal_stream(record.model, job) for job in record.job_ids))
    if journals < len(record.job_ids) and (after >= 0 or owner == DONE):  # events the client saw are gone
        raise StreamNotFound(gone)
    if not record.background:
        await broker.streams.claim(stream_id)
    note_request().request_id = record.request_id
    return record


async def follow(broker: Broker, record: StreamRecord, n: int) -> RequestEvents:
    """The events of the stream's jobs from their journals' first, then live."""
    return await RequestEvents.follow(broker, [JobRef(job, record.model, record.deadline) for job in record.job_ids], n)
