"""The relay load client: a lean asyncio SSE client (raw HTTP/1.1 on loopback, a few microseconds per event),
so one process can hold a thousand streams against a gateway in front of bench/standin_worker.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from array import array
from dataclasses import dataclass, field

from standin_worker import percentiles


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
    except TimeoutError:
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


