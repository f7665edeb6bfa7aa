"""A Redis Sentinel test bed of real processes: a primary, a replica and three sentinels on free loopback ports,
with short failover timings (down-after 1 s, failover-timeout 3 s), for the tests of REDIS_SENTINELS."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import redis

from llmfleet.redis_server import free_port, redis_server_binary
from tests.support.processes import wait_until

MASTER = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class SentinelBed:
    """Primary, replica and 3 sentinels; `settings` are the env settings that point llmfleet at them."""

    def __init__(self, logdir: Path | None = None) -> None:
        self.dir = Path(logdir or tempfile.mkdtemp(prefix="llmfleet-sentinel-"))
        self.primary_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def settings(self) -> dict[str, str]:
        """REDIS_URL (its host and port unused under Sentinel), REDIS_SENTINELS and REDIS_SENTINEL_MASTER."""
        return {"REDIS_URL": f"redis://127.0.0.1:{self.primary_port}/0",
                "REDIS_SENTINELS": ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports),
                "REDIS_SENTINEL_MASTER": MASTER}

    def _spawn(self, name: str, args: list[str]) -> None:
        with (self.dir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen([redis_server_binary(), *args], stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def _server_args(self, port: int) -> list[str]:
        data = self.dir / f"data-{port}"
        data.mkdir(exist_ok=True)
        return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(data)]

    def _sentinel_conf(self, port: int) -> Path:
        conf = self.dir / f"sentinel-{port}.conf"
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                        f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
                        f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                        f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
                        f"sentinel parallel-syncs {MASTER} 1\n")
        return conf

    def start(self, timeout_s: float = 30.0) -> SentinelBed:
        """Start everything; returns once the replica is in sync and every sentinel knows the replica and the two
        other sentinels (a failover needs both)."""
        self._spawn("primary", self._server_args(self.primary_port))
        # writable: a test deletes from it what asynchronous replication could have lost (a proxy that holds the
        # link would not do: the sentinels re-point a replica that follows another address at the primary itself)
        self._spawn("replica", [*self._server_args(self.replica_port), "--replicaof", "127.0.0.1",
                                str(self.primary_port), "--replica-read-only", "no"])
        for port in self.sentinel_ports:
            self._spawn(f"sentinel-{port}", [str(self._sentinel_conf(port)), "--sentinel"])
        wait_until(self._replica_synced, timeout_s, "the replica's sync", interval_s=0.1)
        wait_until(self._sentinels_settled, timeout_s, "the sentinels to find the replica and each other",
                   interval_s=0.2)
        return self

    def client(self, port: int) -> redis.Redis:
        """A plain client of one server of the bed (the primary's or the replica's port), not through Sentinel."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)

    def _replica_synced(self) -> bool:
        try:
            with self.client(self.replica_port) as client:
                return client.info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False

    def _sentinels_settled(self) -> bool:
        try:
            for port in self.sentinel_ports:
                with self.client(port) as client:
                    if len(client.sentinel_slaves(MASTER)) != 1 or len(client.sentinel_sentinels(MASTER)) != 2:
                        return False
            return True
        except redis.RedisError:
            return False

    def primary_address(self) -> tuple[str, int] | None:
        """The primary the first sentinel that answers names (None when none names a healthy one)."""
        for port in self.sentinel_ports:
            try:
                with self.client(port) as client:
                    state: dict[str, Any] = client.sentinel_master(MASTER)
            except redis.RedisError:
                continue
            if "s_down" not in state.get("flags", "") and "o_down" not in state.get("flags", ""):
                return state["ip"], int(state["port"])
        return None

    def kill_primary(self) -> None:
        """kill -9 the primary redis-server (it stays dead)."""
        os.kill(self.procs["primary"].pid, signal.SIGKILL)
        self.procs["primary"].wait()

    def wait_promoted(self, timeout_s: float = 30.0) -> None:
        """Until the sentinels name the replica as the primary."""
        wait_until(lambda: self.primary_address() == ("127.0.0.1", self.replica_port), timeout_s,
                   "the sentinels to promote the replica", interval_s=0.05)

    def close(self) -> None:
        """Stop every process of the bed."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


    def __enter__(self) -> SentinelBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
