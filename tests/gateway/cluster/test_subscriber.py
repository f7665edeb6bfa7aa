"""The gateway's pub/sub subscriber over a real redis-server reached through bench/delay_proxy.py: a connection
that silently stops delivering (the proxy holds every byte, as a partition drops packets without a reset) is
found dead by its PING watchdog, dialled again, its channels subscribed again, and each queue told RESYNC once
the subscription is live; messages flow again after."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from bench.delay_proxy import HELD_S
from gateway.cluster.subscriber import RESYNC, Subscriber

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def _next(queue: asyncio.Queue, timeout_s: float = 10.0) -> object:
    return await asyncio.wait_for(queue.get(), timeout_s)


async def test_a_silent_connection_is_dialled_again_and_every_stream_resyncs(proxied_redis) -> None:
    url, proxy = proxied_redis
    direct = Redis.from_url(url)
    through_proxy = Redis.from_url(f"redis://127.0.0.1:{proxy.port}/0")
    errors: list[int] = []
    answers: list[int] = []
    subscriber = Subscriber(through_proxy, ping_every_s=0.2, dead_after_s=0.6, confirm_timeout_s=2.0,
                            on_error=lambda: errors.append(1), on_answer=lambda: answers.append(1))
    await subscriber.start()
    try:
        queue = await subscriber.subscribe("events:a")
        await direct.publish("events:a", b"before")
        assert await _next(queue) == b"before"

        proxy.set_rtt(HELD_S)  # nothing more comes through this connection, and nothing resets it
        await direct.publish("events:a", b"lost")
        for _ in range(100):  # found dead within ping_every_s + dead_after_s, plus a check's slice
            if errors:
                break
            await asyncio.sleep(0.05)
        assert errors, "the watchdog did not notice the silent connection"
        assert queue.empty()
        answers.clear()

        proxy.set_rtt(0.0)  # new connections through the proxy flow again
        assert await _next(queue) is RESYNC  # after the channel was subscribed again: read the journal now
        assert answers  # the health probe is told Redis answers (admission stops refusing) without its next PING
        assert subscriber.reconnects >= 1
        await direct.publish("events:a", b"after")
        assert await _next(queue) == b"after"
        assert subscriber.active == 1
    finally:
        await subscriber.close()
        await through_proxy.aclose()
        await direct.aclose()


async def test_a_quiet_healthy_connection_is_not_dialled_again(proxied_redis) -> None:
    url, proxy = proxied_redis
    through_proxy = Redis.from_url(f"redis://127.0.0.1:{proxy.port}/0")
    subscriber = Subscriber(through_proxy, ping_every_s=0.1, dead_after_s=0.5)
    await subscriber.start()
    try:
        queue = await subscriber.subscribe("events:b")
        await asyncio.sleep(1.5)  # quiet: PINGs go out and are answered
        assert subscriber.reconnects == 0 and queue.empty()
    finally:
        await subscriber.close()
        await through_proxy.aclose()
