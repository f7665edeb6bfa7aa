"""Network partitions in the namespace test bed (tests/support/netns.py): Redis, gateways and workers on hosts of
their own, joined by a bridge; SmolLM2 workers with default heartbeat and lease settings.

- A worker dropped off the network for 20 s mid-stream: the other worker takes its streams over, clients get
  byte-identical text and never wait 5 s without a byte; when the lost worker comes back it is fenced off (its
  late work is dropped, not published: no journal is written again) and serves again.
- A gateway cut off from Redis for 20 s, with a stream open and again while idle, then healed: a request sent
  once the gateway sees Redis again completes promptly, the open stream completes or ends with an in-stream
  error, never hangs; after a shorter cut during which Redis's host forgot the gateway's connections (a reset
  lost in the cut: the pub/sub socket stays open and silent for good), the open stream completes byte-identical
  (its pub/sub connection found dead by its PING watchdog, dialled again, the stream read back from its journal).
- A gateway cut off from Redis while its clients still reach it: its clients get their stream or an error within
  LOST_AFTER_S (then a 503 `unavailable` in the stream), never silence forever; a new request gets a fast 503; the other gateway's streams are untouched; after the cut heals it serves again.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from gateway.cluster.redis_health import LOST_AFTER_S
from shared import keys
from tests.faults.process_cluster import MODEL, job_holders, wait_until
from tests.support.netns import NetnsBed, NetnsCluster, start_cluster, unavailable
from tests.support.sse import split_id

pytestmark = [pytest.mark.slow, pytest.mark.integration]
PARTITION_S = 20.0
MAX_SILENCE_S = 5.0
HEALED_WITHIN_S = 45.0  # a request sent right after a heal completes within this (pub/sub found dead in ~5 s)
SHORT_CUT_S = 8.0
REQUESTS = [  # (name, request body extras)
    ("greedy", {"temperature": 0, "max_tokens": 100}),
    ("seeded-n2", {"temperature": 0.8, "top_p": 0.95, "seed": 5, "n": 2, "max_tokens": 100}),
]


@pytest.fixture()
def netns_cluster(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[Callable[..., NetnsCluster]]:
    """A factory: (gateways, workers, **settings) -> a running cluster in the bed; the bed is removed after."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no namespace test bed: {reason}")
    bed = NetnsBed()

    def start(gateways: int, workers: int, **settings: str) -> NetnsCluster:
        cluster = start_cluster(bed, tmp_path, MODEL, gateways, workers, **settings)
        for url in cluster.gateway_urls:
            wait_until(lambda url=url: _ready(url).get("workers") == workers, 240, f"{url} to see the workers")
        return cluster

    try:
        yield start
    finally:
        bed.close()


def _ready(base: str) -> dict:
    try:
        return httpx.get(base + "/ready", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {}


def _stream(base: str, key: str, extras: dict, result: dict, timeout_s: float = 300) -> None:
    """One streaming completion read as raw bytes: when each piece arrived, the text per choice, how each
    choice finished and whether [DONE] came; an error (HTTP status or transport) lands in result["error"]."""
    body = {"model": MODEL, "prompt": "Tell me a story about a lighthouse keeper.", "stream": True,
            "ignore_eos": True, **extras}
    result.update(times=[], texts={}, finishes=collections.Counter(), done=0)
    buffer = b""
    try:
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=timeout_s,
                          headers={"Authorization": f"Bearer {key}"}) as reply:
            if reply.status_code != 200:
                result["error"] = f"HTTP {reply.status_code}: {reply.read()[:300]!r}"
                return
            for raw in reply.iter_raw():
                result["times"].append(time.monotonic())
                buffer += raw
                *frames, buffer = buffer.split(b"\n\n")
                for frame in (split_id(f)[1] for f in frames):
                    if frame == b"data: [DONE]":
                        result["done"] += 1
                    elif frame.startswith(b"data: {"):
                        chunk = json.loads(frame[6:])
                        if "error" in chunk:
                            result["error"] = f"in-stream error: {chunk['error']}"
                        for choice in chunk.get("choices", []):
                            index = choice["index"]
                            result["texts"][index] = result["texts"].get(index, "") + choice.get("text", "")
                            if choice.get("finish_reason"):
                                result["finishes"][index] += 1
    except httpx.HTTPError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        result["ended"] = time.monotonic()


def _start_all(cluster: NetnsCluster, base: str) -> tuple[dict[str, dict], list[threading.Thread]]:
    results: dict[str, dict] = {name: {} for name, _ in REQUESTS}
    threads = [threading.Thread(target=_stream, args=(base, cluster.api_key, extras, results[name]))
               for name, extras in REQUESTS]
    for thread, (name, _) in zip(threads, REQUESTS):
        thread.start()
        wait_until(lambda name=name: len(results[name].get("times", [])) >= 3, 120, f"{name} to stream")
    return results, threads


def _join(threads: list[threading.Thread], timeout_s: float = 300) -> None:
    for thread in threads:
        thread.join(timeout=timeout_s)
        assert not thread.is_alive(), "a stream hung"


def _longest_silence(results: dict[str, dict], since: float) -> tuple[float, str]:
    gaps = [(b - a, f"{name}: {a - since:+.1f}s after the fault") for name, r in results.items()
            for a, b in zip(r["times"], r["times"][1:]) if b > since]
    return max(gaps, default=(0.0, "no bytes after the fault"))


def _ended_once(name: str, result: dict, choices: int) -> None:
    assert "error" not in result, f"{name}: {result.get('error')}"
    assert result["done"] == 1, f"{name}: [DONE] came {result['done']} times"
    assert dict(result["finishes"]) == {i: 1 for i in range(choices)}, f"{name}: finishes {result['finishes']}"


def _journals(client: redis.Redis) -> list[bytes]:
    """The request journals in Redis. With LLMFLEET_STREAM_RETENTION_S=0 a gateway deletes a request's journal once
    its stream ended, so after every stream ended none is left, unless a fenced-off worker's late publish wrote one
    again (a worker journals each event in the same MULTI as it publishes it)."""
    return list(client.scan_iter(keys.journal_stream(MODEL, "*")))


def test_worker_partitioned_20s_mid_stream(netns_cluster) -> None:
    # no retention: a finished stream's journal goes at once, so a journal left over is a late publish
    cluster = netns_cluster(1, 2, LLMFLEET_SLOTS="4", LLMFLEET_STREAM_RETENTION_S="0")
    base = cluster.gateway_urls[0]
    client = redis.Redis.from_url(cluster.redis_url)
    undisturbed, threads = _start_all(cluster, base)
    _join(threads)
    for name, extras in REQUESTS:
        _ended_once(name, undisturbed[name], extras.get("n", 1))

    disturbed, threads = _start_all(cluster, base)
    wait_until(lambda: bool(job_holders(client)), 10, "a job holder")
    victim = sorted(job_holders(client))[0]
    cluster.bed.partition(victim)
    cut_at = time.monotonic()
    try:
        _join(threads, timeout_s=120)  # finished by the other worker while the victim is still cut off
        assert time.monotonic() - cut_at < PARTITION_S, "the streams were not taken over during the partition"
    finally:
        time.sleep(max(0.0, PARTITION_S - (time.monotonic() - cut_at)))
        cluster.bed.heal(victim)
    for name, extras in REQUESTS:
        _ended_once(name, disturbed[name], extras.get("n", 1))
        assert disturbed[name]["texts"] == undisturbed[name]["texts"], f"{name}: the resumed text differs"
    silence, where = _longest_silence(disturbed, cut_at)
    print(f"worker {victim} partitioned {PARTITION_S:.0f}s; longest client silence {silence:.2f}s ({where})")
    assert silence < MAX_SILENCE_S, f"a client was silent {silence:.1f}s ({where})"

    # back on the network: fenced off (drops what it held without publishing), registers again, serves again
    wait_until(lambda: "fenced off" in cluster.worker_log(victim), 60, f"{victim} to be fenced off")
    wait_until(lambda: _ready(base).get("workers") == 2, 60, f"{victim} to register again")
    time.sleep(2)  # anything it still had queued for Redis would land now
    assert _journals(client) == [], "the fenced-off worker published after it came back"
    after: dict = {}
    _stream(base, cluster.api_key, REQUESTS[0][1], after)  # served again (by either worker)
    _ended_once("after", after, 1)
    assert after["texts"] == undisturbed[REQUESTS[0][0]]["texts"]


def test_gateway_cut_off_from_redis(netns_cluster) -> None:
    cluster = netns_cluster(2, 2, LLMFLEET_SLOTS="4")
    cut_gateway, other_gateway = cluster.gateway_urls
    undisturbed, threads = _start_all(cluster, other_gateway)
    _join(threads)

    on_cut, cut_threads = _start_all(cluster, cut_gateway)
    cluster.bed.cut("gw0", "redis")
    cut_at = time.monotonic()
    # the other gateway serves as before, during the cut
    on_other, other_threads = _start_all(cluster, other_gateway)
    late: dict = {}
    late_thread = threading.Thread(target=_stream, args=(cut_gateway, cluster.api_key, REQUESTS[0][1], late))
    late_thread.start()  # a request arriving at the cut-off gateway
    _join(other_threads, timeout_s=120)
    for name, extras in REQUESTS:
        _ended_once(name, on_other[name], extras.get("n", 1))
        assert on_other[name]["texts"] == undisturbed[name]["texts"]
    # the cut gateway's clients: each gets its whole stream or an error, within a bound, never silence forever
    _join([*cut_threads, late_thread], timeout_s=LOST_AFTER_S + 15)
    outcomes = {name: r.get("error") or "completed" for name, r in [*on_cut.items(), ("late", late)]}
    print(f"gateway cut from Redis: its clients' outcomes {outcomes}; ended "
          f"{max(r['ended'] for r in [*on_cut.values(), late]) - cut_at:.1f}s after the cut")
    for name, result in on_cut.items():
        assert "unavailable" in result.get("error", "unavailable"), f"{name}: {result['error']}"
        if "error" not in result:
            choices = dict(REQUESTS).get(name, {}).get("n", 1)
            _ended_once(name, result, choices)
    assert late.get("error", "").startswith("HTTP 503"), f"the late request: {late.get('error', 'completed')}"

    cluster.bed.join("gw0", "redis")
    wait_until(lambda: _ready(cut_gateway).get("workers") == 2, 30, "the cut gateway to see the workers again")
    healed, threads = _start_all(cluster, cut_gateway)
    _join(threads)
    for name, extras in REQUESTS:
        _ended_once(name, healed[name], extras.get("n", 1))
        assert healed[name]["texts"] == undisturbed[name]["texts"]


def _after_heal(cluster: NetnsCluster, base: str, healed_at: float, reference: dict) -> float:
    """Once the gateway sees Redis again (its health probe: well under a second after the heal, a request before
    that is a fast 503 by design), a request must complete with the undisturbed text; returns its seconds."""
    wait_until(lambda: _ready(base).get("workers") == 1, 10, "the gateway to see Redis and the worker again")
    result: dict = {}
    _stream(base, cluster.api_key, REQUESTS[0][1], result, timeout_s=HEALED_WITHIN_S)
    if "error" in result:
        print((cluster.logs / "gw0.log").read_text(errors="replace")[-3000:])
    _ended_once("after the heal", result, 1)
    assert result["texts"] == reference["texts"]
    took = result["ended"] - healed_at
    assert took < HEALED_WITHIN_S, f"the request after the heal took {took:.1f}s"
    return took


def _cut_for(cluster: NetnsCluster, gateway: str, seconds: float, during: Callable[[], None] = lambda: None
             ) -> float:
    cluster.bed.cut(gateway, "redis")
    time.sleep(seconds / 2)
    during()
    time.sleep(seconds / 2)
    cluster.bed.join(gateway, "redis")
    return time.monotonic()


def _open_stream(cluster: NetnsCluster, base: str, body: dict) -> tuple[dict, threading.Thread]:
    result: dict = {}
    thread = threading.Thread(target=_stream, args=(base, cluster.api_key, body, result))
    thread.start()
    wait_until(lambda: len(result.get("times", [])) >= 3, 120, "the stream to start")
    return result, thread


def test_gateway_cut_20s_then_healed_serves_at_once(netns_cluster) -> None:
    cluster = netns_cluster(1, 1)
    base = cluster.gateway_urls[0]
    long_request = {"temperature": 0, "max_tokens": 200}
    reference: dict = {}
    _stream(base, cluster.api_key, REQUESTS[0][1], reference)
    _ended_once("reference", reference, 1)
    undisturbed: dict = {}
    _stream(base, cluster.api_key, long_request, undisturbed)
    _ended_once("undisturbed", undisturbed, 1)
    took = {}

    # a stream open through a 20 s cut: it completes (from the journal) or ends with an in-stream error
    opened, thread = _open_stream(cluster, base, long_request)
    healed_at = _cut_for(cluster, "gw0", PARTITION_S)
    took["after the cut with a stream open"] = _after_heal(cluster, base, healed_at, reference)
    thread.join(timeout=HEALED_WITHIN_S)
    assert not thread.is_alive(), "the stream open through the cut hung after the heal"
    if "error" in opened:
        assert "unavailable" in opened["error"], opened["error"]
    else:
        _ended_once("open through the cut", opened, 1)
        assert opened["texts"] == undisturbed["texts"]

    # idle through a 20 s cut
    healed_at = _cut_for(cluster, "gw0", PARTITION_S)
    took["after an idle cut"] = _after_heal(cluster, base, healed_at, reference)

    # a cut shorter than LOST_AFTER_S during which Redis's host forgets the gateway's connections (`ss -K`: as a
    # failover, a reboot or a NAT's timeout would; the reset is lost in the cut, so the gateway's sockets stay
    # open and silent for good): the open stream is not given up; it completes, byte-identical, once the pub/sub
    # connection is found dead and dialled again
    def forget_gateway_connections() -> None:
        killed = cluster.bed.run_in("redis", ["ss", "-K", "dst", cluster.bed.hosts["gw0"].address])
        if killed.returncode != 0:  # a kernel without CONFIG_INET_DIAG_DESTROY
            pytest.skip(f"`ss -K` cannot destroy sockets here: {killed.stderr.strip()}")
        assert "ESTAB" in killed.stdout, "Redis had no connection of the gateway to forget"

    opened, thread = _open_stream(cluster, base, long_request)
    healed_at = _cut_for(cluster, "gw0", SHORT_CUT_S, during=forget_gateway_connections)
    thread.join(timeout=HEALED_WITHIN_S)
    assert not thread.is_alive(), "the stream open through the short cut hung after the heal"
    _ended_once("open through the short cut", opened, 1)
    assert opened["texts"] == undisturbed["texts"]
    took["the stream open through a short cut"] = opened["ended"] - healed_at
    print("seconds from the heal to completion: " + ", ".join(f"{k} {v:.1f}" for k, v in took.items()))
