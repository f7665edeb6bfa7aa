"""worker.serve.redis_client over a real redis-server behind a proxy that stops forwarding on the connections open
at a moment (a partition that lost their packets; new connections flow): a command on such a connection fails
within the socket timeout (shared/redis_sockets.py) and the next one dials afresh; the heartbeat thread registers
again on its own; the feeder's blocking read is not cut by the timeout."""

from __future__ import annotations

import time

import pytest
import redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import keys
from shared.redis_sockets import COMMAND_TIMEOUT_S, MAX_BLOCK_S
from worker.serve.heartbeat import Heartbeat
from worker.serve.job_feeder import IDLE_BLOCK_MS
from worker.serve.redis_client import connect

pytestmark = pytest.mark.integration
SLACK_S = 1.5  # scheduling on a busy machine


def _through(proxy) -> redis.Redis:
    return connect(f"redis://127.0.0.1:{proxy.port}/0")


def test_a_command_on_a_held_connection_fails_within_the_timeout_then_the_next_dials_afresh(proxied_redis) -> None:
    _url, proxy = proxied_redis
    client = _through(proxy)
    client.set("k", b"v")
    proxy.hold_open()
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError):
        client.get("k")
    assert time.monotonic() - started < 2 * COMMAND_TIMEOUT_S  # one timeout: a retried command would take two
    assert client.get("k") == b"v"
    client.close()


def test_the_heartbeat_registers_again_after_its_connection_went_silent(proxied_redis) -> None:
    url, proxy = proxied_redis
    direct = redis.Redis.from_url(url)
    beat = Heartbeat(_through(proxy), worker_id="w1", model="m", slots=4, interval_s=0.2, ttl_s=3.0,
                     gauges=lambda: {"load": 0, "served": 0}, held_jobs=list)
    beat.start()
    try:
        def registered_after(moment: float, within_s: float) -> bool:
            deadline = time.monotonic() + within_s
            while time.monotonic() < deadline:
                written = direct.hget(keys.worker_key("w1"), "heartbeat")
                if written is not None and float(written) > moment:
                    return True
                time.sleep(0.05)
            return False

        assert registered_after(0.0, 5.0)
        proxy.hold_open()
        held_at = time.time()
        assert registered_after(held_at + 0.5, COMMAND_TIMEOUT_S + 1.0 + SLACK_S)  # a fresh connection's beat
    finally:
        beat.stop()
        direct.close()


def test_the_feeders_blocking_read_is_not_cut_by_the_timeout(proxied_redis) -> None:
    _url, proxy = proxied_redis
    assert IDLE_BLOCK_MS / 1000 <= MAX_BLOCK_S
    client = _through(proxy)
    proxy.set_rtt(0.05)  # a Redis in another zone
    client.xgroup_create("jobs", keys.JOBS_GROUP, id="0", mkstream=True)
    started = time.monotonic()
    assert not client.xreadgroup(keys.JOBS_GROUP, "w1", {"jobs": ">"}, count=1, block=IDLE_BLOCK_MS)
    assert time.monotonic() - started >= IDLE_BLOCK_MS / 1000  # it blocked its whole time and ended normally
    client.close()
