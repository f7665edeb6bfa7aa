"""A Redis Cluster test bed of real processes: three primaries (cluster-enabled; with `replicas`, that many
replicas of each, which the cluster promotes when their primary dies) on free loopback ports, the 16,384 slots
split in three, joined with CLUSTER MEET; ready once every node says cluster_state:ok (and every replica follows).

It runs a redis-server 7.0 or later found on PATH (or /usr/bin/redis-server: sharded pub/sub, which llmfleet's
REDIS_CLUSTER mode needs) before the bundled 6.2 one; `sharded` says whether it can."""

from __future__ import annotations

import random
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
import redis

from llmfleet.redis_server import redis_server_binary
from tests.support.processes import wait_until

SLOTS = 16384
SHARDED_PUBSUB = (7, 0)


def server_version(binary: str) -> tuple[int, ...]:
    """`redis-server --version`'s v=X.Y.Z as a tuple ((0,) when unreadable)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return (0,)
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(part) for part in found.groups()) if found else (0,)


def cluster_binary() -> str:
    """A redis-server for the bed: one >= 7.0 on PATH or at /usr/bin, else the bundled (6.2) one."""
    for candidate in (shutil.which("redis-server"), "/usr/bin/redis-server"):
        if candidate and Path(candidate).is_file() and server_version(candidate) >= SHARDED_PUBSUB:
            return candidate
    return redis_server_binary()
BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000
# Both a node's port and its bus port stay below Linux's default ephemeral range (32768-60999): a port chosen there
# can be taken by any outgoing connection between choosing it and the node binding it.
LOWEST_PORT, HIGHEST_PORT = 10000, 32767 - BUS_OFFSET
NODE_ATTEMPTS = 5  # a node whose port was taken meanwhile is started again on another


def cluster_port() -> int:
    """A port whose cluster bus port is free too, both below the ephemeral range."""
    for _ in range(200):
        port = random.randint(LOWEST_PORT, HIGHEST_PORT)
        try:
            for candidate in (port, port + BUS_OFFSET):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports for a cluster node")


class ClusterBed:
    """Three cluster-enabled redis-server processes; `startup_nodes` is what a cluster client starts from."""

    def __init__(self, primaries: int = 3, replicas: int = 0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="llmfleet-cluster-"))
        self.ports = [cluster_port() for _ in range(primaries)]
        self.replica_ports = [cluster_port() for _ in range(primaries * replicas)]  # replica i follows primary i % n
        self.procs: list[subprocess.Popen[bytes]] = []  # the primaries', then the replicas' processes
        self.binary = cluster_binary()
        self.version = server_version(self.binary)

    @property
    def sharded(self) -> bool:
        """Whether the nodes run sharded pub/sub (Redis 7.0 or later), as REDIS_CLUSTER=1 needs."""
        return self.version >= SHARDED_PUBSUB

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of every primary."""
        return [("127.0.0.1", port) for port in self.ports]

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        node_dir = self.dir / str(port)
        node_dir.mkdir()
        args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(node_dir), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000"]
        with (node_dir / "redis.log").open("ab") as out:
            return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _start_node(self, port: int) -> int:
        """Start a node and wait until it answers; one that exits at start-up (its port or bus port taken since
        it was chosen) is started again on a fresh port. Returns the port it listens on."""
        for _ in range(NODE_ATTEMPTS):
            proc = self._spawn(port)
            client = redis.Redis(port=port, socket_timeout=5)
            try:
                wait_until(partial(_answers, client), 10, f"the cluster node on port {port} to answer", procs=[proc])
            except RuntimeError:
                port = cluster_port()
                continue
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                client.close()
            self.procs.append(proc)
            return port
        raise RuntimeError(f"no cluster node started in {NODE_ATTEMPTS} attempts")

    def start(self, timeout_s: float = 30.0) -> ClusterBed:
        """Start the nodes, give each a third of the slots, introduce them, wait for cluster_state:ok (stops
        them all when that fails)."""
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> ClusterBed:
        self.ports = [self._start_node(port) for port in self.ports]
        clients = [redis.Redis(port=port, socket_timeout=5) for port in self.ports]
        bounds = [SLOTS * i // len(clients) for i in range(len(clients) + 1)]
        for client, low, high in zip(clients, bounds, bounds[1:]):
            client.execute_command("CLUSTER ADDSLOTS", *range(low, high))  # ADDSLOTSRANGE needs Redis 7
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
        wait_until(lambda: all(_state(c) == "ok" for c in clients), timeout_s,
                   "cluster_state:ok on every node")
        wait_until(lambda: all(len(c.execute_command("CLUSTER NODES")) == len(clients) for c in clients),
                   timeout_s, "every node to know every other")
        if self.replica_ports:
            self._add_replicas(clients, timeout_s)
        for client in clients:
            client.close()
        return self

    def _add_replicas(self, primaries: list[redis.Redis], timeout_s: float) -> None:
        """Start the replicas, introduce them and make replica i follow primary i % primaries."""
        self.replica_ports = [self._start_node(port) for port in self.replica_ports]
        replicas = [redis.Redis(port=port, socket_timeout=5) for port in self.replica_ports]
        ids = [p.execute_command("CLUSTER MYID") for p in primaries]
        for replica in replicas:
            replica.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
        known = len(primaries) + len(replicas)
        wait_until(lambda: all(len(r.execute_command("CLUSTER NODES")) == known for r in replicas), timeout_s,
                   "the replicas to know every node")
        for i, replica in enumerate(replicas):
            replica.execute_command("CLUSTER REPLICATE", ids[i % len(ids)])
        wait_until(lambda: all(r.info("replication").get("master_link_status") == "up" for r in replicas),
                   timeout_s, "every replica to follow its primary")
        for replica in replicas:
            replica.close()

    def kill_primary(self, index: int) -> None:
        """kill -9 primary `index` (its replica is promoted once the others judge it failed, ~2-4 s)."""
        self.procs[index].kill()
        self.procs[index].wait()

    def client(self) -> redis.RedisCluster:
        """A redis-py cluster client of the bed."""
        return redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in self.startup_nodes],
                                  socket_timeout=5)

    def stop(self) -> None:
        """Terminate every node and remove their directories."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ClusterBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def sharded_bed(replicas: int = 0, timeout_s: float = 60.0) -> Iterator[ClusterBed]:
    """A started bed whose nodes run sharded pub/sub (as REDIS_CLUSTER=1 needs), stopped on exit; the test is
    skipped, saying why, where there is none."""
    try:
        bed = ClusterBed(replicas=replicas).start(timeout_s=timeout_s)
    except RuntimeError as exc:
        pytest.skip(f"no Redis Cluster bed: {exc}")
    try:
        if not bed.sharded:
            pytest.skip(f"the bed's redis-server {bed.version} has no sharded pub/sub (7.0 or later needed)")
        yield bed
    finally:
        bed.stop()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _state(client: redis.Redis) -> str:
    """cluster_state from CLUSTER INFO (redis-py parses it into a dict)."""
    info = client.execute_command("CLUSTER INFO")
    value = info.get("cluster_state", "") if isinstance(info, dict) else ""
    return value.decode() if isinstance(value, bytes) else str(value)
