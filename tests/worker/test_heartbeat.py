"""worker.heartbeat: the smoothed finish rate the gateways' admission reads."""

from __future__ import annotations

import pytest


def test_the_finish_rate_follows_the_counter_smoothly() -> None:
    from worker.heartbeat import EwmaRate

    meter = EwmaRate(time_constant_s=30.0)
    assert meter.update(0, now=100.0) == 0.0  # one reading: no rate yet
    for second in range(1, 301):  # 4 requests per second for five minutes
        rate = meter.update(4 * second, now=100.0 + second)
    assert rate == pytest.approx(4.0, rel=1e-3)
    for second in range(301, 331):  # then nothing for 30 s (one time constant): down to about 1/e
        rate = meter.update(1200, now=100.0 + second)
    assert rate == pytest.approx(4.0 / 2.718, rel=0.02)


def test_the_heartbeat_publishes_the_token_rate_and_the_tokens_left() -> None:
    """What the gateways' admission weighs work in tokens with: tokens generated per second, tokens still to come."""
    import fakeredis

    from shared import keys
    from worker.heartbeat import Heartbeat

    counters = {"generated_tokens": 0.0, "tokens_left": 300.0}
    beat = Heartbeat(fakeredis.FakeRedis(), worker_id="w1", model="m", slots=4, interval_s=1.0, ttl_s=3.0,
                     gauges=lambda: {"load": 2, "served": 0}, held_jobs=list, stats=lambda: dict(counters))
    beat.beat()
    counters.update(generated_tokens=500.0, tokens_left=120.0)
    beat.beat()
    entry = beat.redis.hgetall(keys.worker_key("w1"))
    assert float(entry[b"stat.token_rate"]) > 0 and float(entry[b"stat.tokens_left"]) == 120.0
