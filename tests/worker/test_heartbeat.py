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
