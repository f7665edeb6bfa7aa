"""A stand-in engine for gateway relay benchmarks: a live worker that streams numbered tokens at a fixed rate.

It registers exactly as worker/heartbeat.py does (registry hash with EXPIRE, llmfleet:workers and
llmfleet:models sorted sets, lease renewal by XCLAIM), takes jobs from the model's stream with XREADGROUP
(group shared.keys.JOBS_GROUP, created with MKSTREAM when missing), and every 1/rate seconds emits one
TokenEvent per choice of every held job, all of them journaled and published in ONE MULTI/EXEC per tick
(as worker/publisher.py does). After max_tokens tokens a job ends with ChoiceEnd + Done and is XACKed.
Each token's text is "<k>@<unix time of the tick's publish> " so a client can check order and latency.
Also here: run_relay, the lean asyncio SSE client bench/cluster.py drives a gateway in front of it with
(raw HTTP/1.1 on loopback, a few microseconds per event, so a thousand streams do not saturate the client).
Run: python bench/standin_worker.py --redis-url redis://127.0.0.1:PORT/0 [--model standin] [--rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
import uuid
from array import array
from dataclasses import dataclass, field

import msgpack
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, ResponseError

from shared import codec, keys
from shared.errors import InvalidRequest
from shared.messages import (
    WIRE_VERSION,
    CancelRequest,
    ChoiceEndEvent,
    DoneEvent,
    FinishReason,
    GenerateJob,
    TokenEvent,
    Usage,
)
from worker.publisher import JOURNAL_MAXLEN

log = logging.getLogger("standin")
DEFAULT_MAX_TOKENS = 16
INTAKE_BLOCK_MS = 100
INTAKE_BATCH = 500


def token_event_bytes(request_id: str, seq: int, index: int, text: str, token_id: int) -> bytes:
    """The codec bytes of a plain TokenEvent, packed directly (checked against shared.codec at start-up)."""
    return msgpack.packb({"kind": "token", "id": request_id, "seq": seq, "index": index, "text": text,
                          "token_ids": [token_id], "logprobs": None, "echo": False, "version": WIRE_VERSION},
                         use_bin_type=True)


def check_fast_encoding() -> None:
    """Fail fast if the direct packing ever stops matching shared.codec's encoding."""
    expected = codec.encode(TokenEvent(id="req-x", seq=3, index=1, text="7@1.5 ", token_ids=[8]))
    if token_event_bytes("req-x", 3, 1, "7@1.5 ", 8) != expected:
        raise RuntimeError("token_event_bytes no longer matches shared.codec.encode; update the stand-in")


@dataclass
class HeldStream:
    """One job this stand-in holds: how far it got, and whether it was cancelled."""

    job_id: str
    message_id: bytes
    n: int
    max_tokens: int
    prompt_tokens: int
    seq: int = 0
    sent: int = 0  # tokens emitted per choice
    cancelled: bool = False


@dataclass
class TickStats:
    """What the ticker did: for the relay report (the stand-in's own share of the latency)."""

    ticks: int = 0
    late_ticks: int = 0
    events: int = 0
    jobs: int = 0
    max_active: int = 0
    build_s: list[float] = field(default_factory=list)
    execute_s: list[float] = field(default_factory=list)


class StandinWorker:
    """The stand-in: heartbeat, intake, cancel listener and the fixed-rate ticker, all on one event loop."""

    def __init__(self, redis: Redis, *, model: str, rate: float, slots: int, heartbeat_s: float = 2.0,
                 ttl_s: float = 10.0, journal_ttl_s: int = 660) -> None:
        self.redis = redis
        self.model = model
        self.period = 1.0 / rate
        self.slots = slots
        self.heartbeat_s = heartbeat_s
        self.ttl_s = ttl_s
        self.journal_ttl_s = journal_ttl_s
        self.worker_id = f"{model}-standin-{uuid.uuid4().hex[:8]}"
        self.stream = keys.jobs_stream(model)
        self.started = time.time()
        self.held: dict[str, HeldStream] = {}
        self.stats = TickStats()
        self.stop = asyncio.Event()

    async def run(self) -> TickStats:
        """Register, serve until stop is set, then deregister."""
        try:
            await self.redis.xgroup_create(self.stream, keys.JOBS_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await self.beat()
        tasks = [asyncio.create_task(coro) for coro in
                 (self._heartbeat_loop(), self._intake_loop(), self._cancel_loop(), self._tick_loop())]
        try:
            await self.stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(keys.worker_key(self.worker_id))
            pipe.zrem(keys.WORKERS_INDEX, self.worker_id)
            await pipe.execute()
        return self.stats

    async def beat(self) -> None:
        """Write the registry entry (as worker/heartbeat.py does) and renew the lease of every held job."""
        now = time.time()
        key = keys.worker_key(self.worker_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={"model": self.model, "slots": self.slots, "load": len(self.held),
                                "version": WIRE_VERSION, "heartbeat": now, "started": self.started, "state": "ready"})
        pipe.expire(key, max(1, int(self.ttl_s)))
        pipe.zadd(keys.WORKERS_INDEX, {self.worker_id: now})
        pipe.zadd(keys.MODELS_INDEX, {self.model: now})
        await pipe.execute()
        held = [h.message_id for h in self.held.values()]
        for start in range(0, len(held), 500):
            await self.redis.xclaim(self.stream, keys.JOBS_GROUP, self.worker_id, 0, held[start:start + 500],
                                    justid=True)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.beat()
            except RedisError as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _intake_loop(self) -> None:
        while True:
            free = self.slots - len(self.held)
            if free <= 0:
                await asyncio.sleep(0.05)
                continue
            try:
                reply = await self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, {self.stream: ">"},
                                                    count=min(free, INTAKE_BATCH), block=INTAKE_BLOCK_MS)
            except RedisError as exc:
                log.warning("intake failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            for _stream, messages in reply or []:
                for message_id, fields in messages:
                    await self._accept(message_id, fields)

    async def _accept(self, message_id: bytes, fields: dict[bytes, bytes]) -> None:
        """Hold a generate job; anything else ends at once with an error event."""
        try:
            job = codec.decode_job(fields[keys.JOB_FIELD.encode()])
        except (codec.WireFormatError, KeyError):
            await self.redis.xack(self.stream, keys.JOBS_GROUP, message_id)
            return
        if not isinstance(job, GenerateJob):
            data = codec.encode_event(InvalidRequest("the stand-in engine only generates").to_event(job.id, 0))
            pipe = self.redis.pipeline(transaction=True)
            pipe.xadd(keys.journal_stream(job.id), {keys.JOURNAL_SEQ_FIELD: "0", keys.JOURNAL_EVENT_FIELD: data})
            pipe.expire(keys.journal_stream(job.id), self.journal_ttl_s)
            pipe.publish(keys.events_channel(job.id), data)
            pipe.xack(self.stream, keys.JOBS_GROUP, message_id)
            await pipe.execute()
            return
        prompt_tokens = len(job.prompt_token_ids or []) or len((job.prompt or "").split()) or 1
        max_tokens = DEFAULT_MAX_TOKENS if job.max_tokens is None else job.max_tokens
        self.held[job.id] = HeldStream(job.id, message_id, job.n, max_tokens, prompt_tokens)
        self.stats.jobs += 1
        self.stats.max_active = max(self.stats.max_active, len(self.held))

    async def _cancel_loop(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(keys.cancel_channel(self.model))
        try:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None:
                    continue
                try:
                    notice = codec.decode(message["data"])
                except codec.WireFormatError:
                    continue
                if isinstance(notice, CancelRequest) and notice.id in self.held:
                    self.held[notice.id].cancelled = True
        finally:
            await pubsub.aclose()

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            delay = next_tick - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -self.period:
                self.stats.late_ticks += 1
                next_tick = loop.time()  # fell behind a whole period: do not burst to catch up
            next_tick += self.period
            if self.held:
                try:
                    await self._tick()
                except RedisError as exc:
                    log.warning("tick failed: %s", exc)

    async def _tick(self) -> None:
        """One token for every choice of every held job, journaled and published in one MULTI/EXEC."""
        stamp = time.time()
        text_tail = f"@{stamp:.6f} "
        pipe = self.redis.pipeline(transaction=True)
        finished: list[HeldStream] = []
        events = 0
        for held in list(self.held.values()):
            journal, channel = keys.journal_stream(held.job_id), keys.events_channel(held.job_id)
            if held.sent < held.max_tokens and not held.cancelled:
                for index in range(held.n):
                    data = token_event_bytes(held.job_id, held.seq, index, f"{held.sent}{text_tail}",
                                             1 + held.sent % 1000)
                    self._journal_publish(pipe, journal, channel, held.seq, data)
                    held.seq += 1
                    events += 1
                held.sent += 1
            if held.sent >= held.max_tokens or held.cancelled:
                events += self._finish(pipe, held, journal, channel)
                finished.append(held)
        for held in finished:
            del self.held[held.job_id]
        built = time.time()
        await pipe.execute()
        self.stats.ticks += 1
        self.stats.events += events
        self.stats.build_s.append(built - stamp)
        self.stats.execute_s.append(time.time() - built)

    def _journal_publish(self, pipe: Pipeline, journal: str, channel: str, seq: int, data: bytes) -> None:
        pipe.xadd(journal, {keys.JOURNAL_SEQ_FIELD: str(seq), keys.JOURNAL_EVENT_FIELD: data},
                  maxlen=JOURNAL_MAXLEN, approximate=True)
        if seq == 0:
            pipe.expire(journal, self.journal_ttl_s)
        pipe.publish(channel, data)

    def _finish(self, pipe: Pipeline, held: HeldStream, journal: str, channel: str) -> int:
        """Queue ChoiceEnd per choice and the Done event, and the XACK; returns the number of events."""
        reason = FinishReason.CANCELLED if held.cancelled else FinishReason.LENGTH
        for index in range(held.n):
            end = ChoiceEndEvent(id=held.job_id, seq=held.seq, index=index, finish_reason=reason)
            self._journal_publish(pipe, journal, channel, held.seq, codec.encode_event(end))
            held.seq += 1
        completion = held.sent * held.n
        done = DoneEvent(id=held.job_id, seq=held.seq, usage=Usage(
            prompt_tokens=held.prompt_tokens, completion_tokens=completion, total_tokens=held.prompt_tokens + completion))
        self._journal_publish(pipe, journal, channel, held.seq, codec.encode_event(done))
        pipe.expire(journal, self.journal_ttl_s)
        pipe.xack(self.stream, keys.JOBS_GROUP, held.message_id)
        return held.n + 1


def stats_summary(stats: TickStats) -> dict[str, float]:
    """The tick statistics as plain numbers (milliseconds for durations)."""
    build, execute = percentiles(stats.build_s), percentiles(stats.execute_s)
    return {"ticks": stats.ticks, "late_ticks": stats.late_ticks, "events": stats.events, "jobs": stats.jobs,
            "max_active": stats.max_active, "build_ms_p50": 1000 * build["p50"], "build_ms_p99": 1000 * build["p99"],
            "execute_ms_p50": 1000 * execute["p50"], "execute_ms_p99": 1000 * execute["p99"]}


def percentiles(values: list[float] | array) -> dict[str, float]:
    """p50, p90, p99 and max of some values (nan when there are none)."""
    ordered = sorted(values) or [float("nan")]
    return {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))}


# ---- the relay load client --------------------------------------------------------------------------------


@dataclass
class RelayResult:
    """What the client saw of N concurrent streams through one gateway."""

    completed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    peak_open: int = 0  # connections the gateway held at once (request sent, stream not finished)
    peak_streaming: int = 0  # of those, streams whose 200 headers (sent after the first event) had arrived
    tokens: int = 0
    misordered: int = 0  # tokens whose number was not the next one expected (lost, duplicated or reordered)
    wall_s: float = 0.0
    window_s: float = 0.0  # while every stream was streaming: last first-token .. first last-token
    window_rate: float = 0.0
    window_lat: dict[str, float] = field(default_factory=dict)
    all_lat: dict[str, float] = field(default_factory=dict)
    cpu_share: dict[str, float] = field(default_factory=dict)  # over the window, else the whole run
    timeline: list[tuple[float, float, int, int, float]] = field(default_factory=list)  # t, tok/s, open, streaming, gw cpu


class _Totals:
    """State shared by every stream of one relay run."""

    def __init__(self) -> None:
        self.recv = array("d")  # receive time of every token
        self.lat = array("d")  # receive time - publish stamp of every token
        self.open = self.streaming = 0
        self.result = RelayResult()

    def error(self, kind: str) -> None:
        self.result.errors[kind] = self.result.errors.get(kind, 0) + 1


def _error_code(body: bytes, server_side: bool) -> str:
    """The OpenAI error code (or type) in a JSON error body, and for server-side errors the message's start."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return "unreadable"
    code = str(error.get("code") or error.get("type"))
    return f"{code}: {str(error.get('message'))[:70]}" if server_side else code  # 5xx messages hold no request text


class SSEStream(asyncio.Protocol):
    """One streaming POST over its own connection; parses chunked SSE just enough to time every token."""

    def __init__(self, totals: _Totals, request: bytes, done: asyncio.Future[None]) -> None:
        self.totals, self.request, self.done = totals, request, done
        self.transport: asyncio.Transport | None = None
        self.status = b""
        self.buf = b""
        self.next_token = 0
        self.first = self.last = 0.0
        self.streaming = self.finished = self.ok = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.totals.open += 1
        self.totals.result.peak_open = max(self.totals.result.peak_open, self.totals.open)
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now, totals = time.time(), self.totals
        buf = self.buf + data
        if not self.status:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            self.status, buf = buf[9:12], buf[end + 4:]
            if self.status == b"200":
                self.streaming = True
                totals.streaming += 1
                totals.result.peak_streaming = max(totals.result.peak_streaming, totals.streaming)
        end = buf.rfind(b"\n\n") if self.status == b"200" else -1
        if end < 0:
            self.buf = buf
            return
        self.buf = buf[end + 2:]
        for piece in buf[:end].split(b"\n\n"):
            payload = piece[piece.find(b"data: ") + 6:]
            at = payload.find(b'"text":"')
            if at < 0:
                if payload.startswith(b"[DONE]"):
                    self._end(None)
                    return
                if payload.startswith(b'{"error"'):
                    self._end(f"error chunk {_error_code(payload, True)}")
                    return
                continue
            text = payload[at + 8:payload.find(b'"', at + 8)]
            if not text:
                continue  # the finish chunk
            mark = text.find(b"@")
            number, stamp = int(text[:mark]), float(text[mark + 1:])
            if number != self.next_token:
                totals.result.misordered += 1
            self.next_token = number + 1
            totals.recv.append(now)
            totals.lat.append(now - stamp)
            self.first = self.first or now
            self.last = now

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.status:
            self._end(f"connection lost {type(exc).__name__ if exc else ''}".strip())
        elif self.status != b"200":
            self._end(f"HTTP {self.status.decode(errors='replace')} {_error_code(self.buf, self.status >= b'500')}")
        else:
            self._end("closed before [DONE]")

    def _end(self, error: str | None) -> None:
        if self.finished:
            return
        self.finished, self.ok = True, error is None
        self.totals.open -= 1
        self.totals.streaming -= self.streaming
        if error is None:
            self.totals.result.completed += 1
        else:
            self.totals.error(error)
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Sample = tuple[float, dict[str, float], int, int]  # time, CPU seconds by process, open, streaming


async def _sample(pids: dict[str, int], totals: _Totals, samples: list[Sample]) -> None:
    while True:
        samples.append((time.time(), {name: cpu_seconds(pid) for name, pid in pids.items()},
                        totals.open, totals.streaming))
        await asyncio.sleep(0.2)


def _cpu_share(samples: list[Sample], start: float, end: float) -> dict[str, float]:
    """Each process's CPU seconds per second between the samples nearest the window's ends."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return {}
    (t0, c0, *_), (t1, c1, *_) = inside[0], inside[-1]
    return {name: (c1[name] - c0[name]) / (t1 - t0) for name in c0}


async def run_relay(host: str, port: int, model: str, streams: int, max_tokens: int, pids: dict[str, int], *,
                    timeout_s: float, api_key: str = "none", bucket_s: float = 5.0) -> RelayResult:
    """Open `streams` streaming /v1/completions at once, read them to the end (bounded by timeout_s)."""
    loop = asyncio.get_running_loop()
    totals = _Totals()
    samples: list[Sample] = []
    sampler = asyncio.create_task(_sample(pids, totals, samples))
    protocols: list[SSEStream] = []

    async def one(i: int) -> None:
        body = json.dumps({"model": model, "prompt": f"relay stream {i}", "max_tokens": max_tokens,
                           "temperature": 0, "stream": True}).encode()
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                   f"Authorization: Bearer {api_key}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                   ).encode() + body
        done: asyncio.Future[None] = loop.create_future()
        try:
            _, protocol = await loop.create_connection(lambda: SSEStream(totals, request, done), host, port)
        except OSError as exc:
            totals.error(f"connect {type(exc).__name__}")
            return
        protocols.append(protocol)
        await done

    started = time.time()
    try:
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(streams))), timeout_s)
    except asyncio.TimeoutError:
        for protocol in protocols:
            protocol._end("timeout")
    finally:
        sampler.cancel()
    result = totals.result
    result.wall_s, result.tokens = time.time() - started, len(totals.recv)
    result.all_lat = percentiles(list(totals.lat))
    timed = [p for p in protocols if p.ok and p.last > p.first]
    if len(timed) == streams:
        window_start, window_end = max(p.first for p in timed), min(p.last for p in timed)
        if window_end > window_start:
            inside = [lat for t, lat in zip(totals.recv, totals.lat) if window_start < t <= window_end]
            result.window_s, result.window_rate = window_end - window_start, len(inside) / (window_end - window_start)
            result.window_lat = percentiles(inside)
            result.cpu_share = _cpu_share(samples, window_start, window_end)
    result.cpu_share = result.cpu_share or _cpu_share(samples, started, time.time())
    for k in range(int(result.wall_s // bucket_s) + 1):
        lo, hi = started + k * bucket_s, started + (k + 1) * bucket_s
        last = [s for s in samples if s[0] <= hi][-1:] or samples[:1]
        result.timeline.append((k * bucket_s, sum(1 for t in totals.recv if lo < t <= hi) / bucket_s,
                                last[0][2], last[0][3], _cpu_share(samples, lo, hi).get("gateway", 0.0)))
    return result


async def amain(args: argparse.Namespace) -> None:
    """Serve until SIGTERM/SIGINT, then write the tick statistics as JSON."""
    check_fast_encoding()
    redis = Redis.from_url(args.redis_url, socket_connect_timeout=5)
    worker = StandinWorker(redis, model=args.model, rate=args.rate, slots=args.slots,
                           heartbeat_s=args.heartbeat_s, ttl_s=args.ttl_s)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop.set)
    try:
        stats = await worker.run()
    finally:
        await redis.aclose()
    summary = json.dumps(stats_summary(stats))
    if args.stats_file:
        with open(args.stats_file, "w", encoding="utf-8") as out:
            out.write(summary)
    else:
        print(summary, flush=True)


def main() -> None:
    """Parse flags and run the stand-in."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--model", default="standin")
    parser.add_argument("--rate", type=float, default=20.0, help="tokens per second per stream")
    parser.add_argument("--slots", type=int, default=2000, help="jobs held at once")
    parser.add_argument("--heartbeat-s", type=float, default=2.0)
    parser.add_argument("--ttl-s", type=float, default=10.0)
    parser.add_argument("--stats-file", default=None, help="write the tick statistics here (else stdout)")
    args = parser.parse_args()
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
