"""worker.serve.heartbeat: the smoothed finish rate the gateways' admission reads."""

from __future__ import annotations

import time
import types
from unittest import mock

import pytest


def test_the_finish_rate_follows_the_counter_smoothly() -> None:
    from worker.serve.heartbeat import EwmaRate

    meter = EwmaRate(time_constant_s=30.0)
    assert meter.update(0, now=100.0) == 0.0  # one reading: no rate yet
    for second in range(1, 301):  # 4 requests per second for five minutes
        rate = meter.update(4 * second, now=100.0 + second)
    assert rate == pytest.approx(4.0, rel=1e-3)
    for second in range(301, 331):  # then nothing for 30 s (one time constant): down to about 1/e
        rate = meter.update(1200, now=100.0 + second)
    assert rate == pytest.approx(4.0 / 2.718, rel=0.02)
    for second in range(331, 631):  # idle for five minutes: nothing measured, the busy rate stands
        assert meter.update(1200, now=100.0 + second, idle=True) == rate


def test_an_idle_worker_keeps_the_rate_it_showed_while_busy() -> None:
    """A quiet minute between two bursts does not make the next burst look slow to the gateways' admission."""
    import fakeredis

    from shared import keys
    from worker.serve.heartbeat import Heartbeat

    gauges, counters = {"load": 4, "served": 0}, {"generated_tokens": 0.0}
    beat = Heartbeat(fakeredis.FakeRedis(), worker_id="w1", model="m", slots=4, interval_s=1.0, ttl_s=3.0,
                     gauges=lambda: dict(gauges), held_jobs=list, stats=lambda: dict(counters))
    clock = [1000.0]

    def beat_at(seconds: float) -> float:
        clock[0] += seconds
        fake_time = types.SimpleNamespace(time=lambda: clock[0], monotonic=time.monotonic)
        with mock.patch("worker.serve.heartbeat.time", fake_time):  # the beat's clock only (Redis keeps its own)
            beat.beat()
        return float(beat.redis.hgetall(keys.worker_key("w1"))[b"stat.token_rate"])

    for _ in range(120):  # two minutes busy at 50 tokens a second
        counters["generated_tokens"] += 50.0
        busy = beat_at(1.0)
    gauges["load"] = 0
    beat_at(1.0)  # the burst ended during this interval: still measured
    quiet = [beat_at(1.0) for _ in range(60)]  # a minute with nothing to do
    assert busy == pytest.approx(50.0, rel=0.05) and quiet[-1] == quiet[0] > 0.9 * busy


def test_the_heartbeat_publishes_the_token_rate_and_the_tokens_left() -> None:
    """What the gateways' admission weighs work in tokens with: tokens generated per second, tokens still to come."""
    import fakeredis

    from shared import keys
    from worker.serve.heartbeat import Heartbeat

    counters = {"generated_tokens": 0.0, "tokens_left": 300.0}
    beat = Heartbeat(fakeredis.FakeRedis(), worker_id="w1", model="m", slots=4, interval_s=1.0, ttl_s=3.0,
                     gauges=lambda: {"load": 2, "served": 0}, held_jobs=list, stats=lambda: dict(counters))
    beat.beat()
    counters.update(generated_tokens=500.0, tokens_left=120.0)
    beat.beat()
    entry = beat.redis.hgetall(keys.worker_key("w1"))
    assert float(entry[b"stat.token_rate"]) > 0 and float(entry[b"stat.tokens_left"]) == 120.0


def test_the_heartbeat_publishes_the_load_its_rates_were_measured_at() -> None:
    """`finish_load` follows the sequences in flight over busy intervals, smoothed as the rates are, and stands
    while the worker is idle (admission scales a finish rate measured under a lighter load by it)."""
    import fakeredis

    from shared import keys
    from worker.serve.heartbeat import EwmaLevel, Heartbeat

    level = EwmaLevel(time_constant_s=30.0)
    assert level.update(1, now=0.0) == 0.0  # one reading: nothing yet
    for second in range(1, 301):
        value = level.update(1, now=float(second))
    assert value == pytest.approx(1.0, rel=1e-3)
    for second in range(301, 331):  # 30 s (one time constant) at 8: about 1 - 1/e of the way
        value = level.update(8, now=float(second))
    assert value == pytest.approx(8 - 7 / 2.718, rel=0.02)
    assert level.update(0, now=400.0, idle=True) == value

    gauges = {"load": 3, "served": 0}
    beat = Heartbeat(fakeredis.FakeRedis(), worker_id="w1", model="m", slots=4, interval_s=1.0, ttl_s=3.0,
                     gauges=lambda: dict(gauges), held_jobs=list)
    beat.beat()
    time.sleep(0.05)
    beat.beat()
    assert 0 < float(beat.redis.hgetall(keys.worker_key("w1"))[b"stat.finish_load"]) <= 3


class _Outage:
    """A FakeRedis whose pipelines fail (as a stopped Redis does) while `down` is set."""

    def __init__(self) -> None:
        import fakeredis

        self.inner = fakeredis.FakeRedis()
        self.down = False

    def pipeline(self, *args: object, **kwargs: object) -> object:
        from redis.exceptions import ConnectionError as RedisConnectionError

        if self.down:
            raise RedisConnectionError("Redis is away")
        return self.inner.pipeline(*args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_the_heartbeat_registers_again_as_soon_as_redis_answers() -> None:
    """After failed beats the heartbeat retries every RETRY_S, not every interval: an outage longer than the TTL
    leaves the worker unregistered for at most RETRY_S once Redis is back."""
    import time

    from shared import keys
    from worker.serve.heartbeat import RETRY_S, Heartbeat

    redis = _Outage()
    beat = Heartbeat(redis, worker_id="w1", model="m", slots=4, interval_s=5.0, ttl_s=10.0,  # type: ignore[arg-type]
                     gauges=lambda: {"load": 0, "served": 0}, held_jobs=list)
    beat.start()
    try:
        assert not beat.recovering()
        redis.down = True
        redis.inner.delete(keys.worker_key("w1"))  # expired during the outage
        time.sleep(5.3)  # the next interval's beat fails
        redis.down = False
        back = time.monotonic()
        while not redis.inner.exists(keys.worker_key("w1")) and time.monotonic() - back < 3:
            time.sleep(0.01)
        assert redis.inner.exists(keys.worker_key("w1"))
        assert time.monotonic() - back <= RETRY_S + 0.3  # not the 5 s interval
        assert beat.recovering()  # for a TTL, other workers' expired entries are not taken for dead ones
    finally:
        beat.stop()


def test_a_refused_beat_keeps_the_worker_alive_and_its_jobs_its_own(redis_server: object) -> None:
    """Redis at maxmemory (noeviction, a real redis-server) refuses the registry write: the beat raises the refusal,
    but the registry key's TTL is renewed and so is the lease of every held job (XCLAIM by its owner resets the
    idle time others' takeovers respect); the worker takes no one else's jobs while its beats fail."""
    import redis

    from shared import keys
    from shared.redis_commands import write_refusal
    from worker.failover.fencing import Lease, take_ownership
    from worker.failover.takeover import claim_from_dead_workers
    from worker.serve.heartbeat import Heartbeat

    client = redis.Redis.from_url(redis_server.url)  # type: ignore[attr-defined]
    stream = keys.jobs_stream("m")
    client.xgroup_create(stream, keys.JOBS_GROUP, id="0", mkstream=True)
    entry = client.xadd(stream, {"job": b"x"}).decode()
    client.xreadgroup(keys.JOBS_GROUP, "w1", {stream: ">"})
    [grant] = take_ownership(client, stream, "w1", "m", [("r", entry)], ttl_s=60)
    lease = Lease(entry, "r", grant.owner, stream)
    beat = Heartbeat(client, worker_id="w1", model="m", slots=2, interval_s=0.2, ttl_s=2.0,
                     gauges=lambda: {"load": 1, "served": 0}, held_jobs=lambda: [lease])
    beat.start()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        time.sleep(2.5)  # past the TTL of the last beat written
        with pytest.raises(redis.ResponseError) as refused:
            beat.beat()
        assert write_refusal(refused.value) == "OOM"
        assert client.pttl(keys.worker_key("w1")) > 1500  # renewed by every refused beat (the TTL is 2 s)
        [pending] = client.xpending_range(stream, keys.JOBS_GROUP, "-", "+", 1)
        assert pending["consumer"] == b"w1" and pending["time_since_delivered"] < 500  # the lease renewed
        assert beat.failing and beat.recovering()  # while its beats fail, no takeovers by this worker
        assert claim_from_dead_workers(client, stream, "w2", count=5, ttl_s=2.0, lease_s=30.0) == []
    finally:
        client.config_set("maxmemory", 0)
    deadline = time.monotonic() + 3
    while beat.failing and time.monotonic() < deadline:
        time.sleep(0.05)
    beat.stop()
    assert not beat.failing and client.hget(keys.worker_key("w1"), "model") == b"m"


def test_the_heartbeat_drops_the_tier_when_the_drop_counter_grows() -> None:
    """The first value read is a baseline; a higher one drops once; a counter lost with Redis (absent) is a new
    baseline of 0, so the next drop after a Redis restart still drops."""
    import fakeredis

    from shared import keys
    from worker.serve.heartbeat import Heartbeat

    redis = fakeredis.FakeRedis()
    redis.set(keys.kv_tier_drop("m"), 3)
    drops: list[int] = []
    beat = Heartbeat(redis, worker_id="w1", model="m", slots=4, interval_s=1.0, ttl_s=3.0,
                     gauges=lambda: {"load": 0, "served": 0}, held_jobs=list, drop_tier=lambda: drops.append(1))
    beat.beat()
    assert drops == []  # a worker (re)starting never drops
    redis.incr(keys.kv_tier_drop("m"))
    beat.beat()
    beat.beat()
    assert drops == [1]
    redis.flushall()  # Redis restarted empty
    beat.beat()
    redis.incr(keys.kv_tier_drop("m"))
    beat.beat()
    assert drops == [1, 1]
