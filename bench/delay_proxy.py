"""A TCP proxy that delays every byte by a one-way latency in each direction: Redis "on another host" on one
machine (the fallback where `tc netem` is not available; see bench/redis_latency.py).

Each direction of each connection has a reader thread that stamps what it reads with its due time and a writer
thread that sends it then (time.sleep is precise to ~0.1 ms; an asyncio loop would round waits up to 1 ms).
Order is kept; the delay can be changed while connections are open (it applies to bytes read from then on).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

CHUNK = 1 << 16
HELD_S = 3600.0  # how long a held connection keeps what it reads: for good


class DelayProxy:
    """Listens on a free loopback port and forwards each connection to (host, port), `one_way_s` late each way."""

    def __init__(self, host: str, port: int, one_way_s: float = 0.0) -> None:
        self.upstream = (host, port)
        self.one_way_s = one_way_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._held: list[threading.Event] = []  # one per connection: set, it forwards nothing more
        self._closed = threading.Event()

    def start(self) -> DelayProxy:
        """Accept connections in a background thread."""
        threading.Thread(target=self._accept, name="delay-proxy", daemon=True).start()
        return self

    def set_rtt(self, rtt_s: float) -> None:
        """Set the round trip this proxy adds (half of it each way)."""
        self.one_way_s = rtt_s / 2

    def hold_open(self) -> None:
        """Forward nothing more on the connections open now, and reset none of them (a partition that lost their
        packets and healed: their peers wait on them until a timeout); connections opened later flow."""
        for held in list(self._held):
            held.set()

    def close(self) -> None:
        """Stop accepting and cut every open connection."""
        self._closed.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.upstream)
            except OSError:
                return
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets.append(sock)
            held = threading.Event()
            self._held.append(held)
            self._pipe(client, upstream, held)
            self._pipe(upstream, client, held)

    def _pipe(self, source: socket.socket, sink: socket.socket, held: threading.Event) -> None:
        """Forward source -> sink, each chunk sent one_way_s after it was read (never, once `held` is set)."""
        chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def read() -> None:
            while True:
                try:
                    data = source.recv(CHUNK)
                except OSError:
                    data = b""
                chunks.put((time.perf_counter() + (HELD_S if held.is_set() else self.one_way_s), data))
                if not data:
                    return

        def write() -> None:
            while True:
                due, data = chunks.get()
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                try:
                    if not data:
                        sink.shutdown(socket.SHUT_WR)
                        return
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, name="delay-proxy-read", daemon=True).start()
        threading.Thread(target=write, name="delay-proxy-write", daemon=True).start()


def measured_rtt_ms(url: str, samples: int = 30) -> float:
    """The median PING round trip (ms) of a Redis client at `url`."""
    import redis

    client = redis.Redis.from_url(url)
    client.ping()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        client.ping()
        times.append(time.perf_counter() - start)
    client.close()
    return sorted(times)[len(times) // 2] * 1000
