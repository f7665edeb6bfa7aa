"""The fleet's recent-error list: capped in Redis, throttled per gateway, unreadable entries skipped."""

from __future__ import annotations

import fakeredis
import pytest

from gateway.http import error_log
from gateway.http.error_log import ErrorLog, RequestNote, make_entry
from shared import keys
from shared.errors import Unavailable

pytestmark = pytest.mark.anyio


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_list_keeps_the_newest_entries_and_the_throttle_drops_a_burst(
        redis: fakeredis.FakeAsyncRedis) -> None:
    clock = FakeClock()
    log = ErrorLog(redis, retry_after_s=1.0, clock=clock)
    burst = int(error_log.WRITES_PER_S)
    for i in range(burst + 5):  # one instant: only the allowance is written
        log.record(make_entry(status=400, type="invalid_request_error", code=None, now=float(i)))
    await log.flush()
    assert log.dropped == 5 and await redis.llen(keys.ERRORS_LIST) == burst
    for i in range(error_log.MAX_ENTRIES + 10):  # slow enough for the throttle: everything is written
        clock.now += 1.0
        log.record(make_entry(status=503, type="server_error", code="unavailable", now=1000.0 + i,
                              note=RequestNote(model="m" * 500, request_id=f"req-{i}")))
        await log.flush()
    assert await redis.llen(keys.ERRORS_LIST) == error_log.MAX_ENTRIES
    entries = await log.recent()
    assert [e["request_id"] for e in entries[:2]] == [f"req-{error_log.MAX_ENTRIES + 9}", f"req-{error_log.MAX_ENTRIES + 8}"]
    assert len(entries[0]["model"]) == error_log.MAX_FIELD_CHARS
    assert len(await log.recent(limit=3)) == 3


async def test_foreign_entries_are_skipped_and_a_lost_redis_is_a_503(redis: fakeredis.FakeAsyncRedis,
                                                                      server: fakeredis.FakeServer) -> None:
    log = ErrorLog(redis, retry_after_s=1.0)
    await redis.lpush(keys.ERRORS_LIST, b"\x80not json", b"[1, 2]", b'{"time": 1.5, "status": 500, "extra": "x"}')
    [entry] = await log.recent()
    assert entry["status"] == 500 and "extra" not in entry and entry["code"] is None
    server.connected = False
    log.record(make_entry(status=500, type="server_error", code=None))  # best effort: no exception
    await log.flush()
    with pytest.raises(Unavailable):
        await log.recent()
    server.connected = True
