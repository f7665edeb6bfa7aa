"""Where the Redis every process shares is found: one URL (REDIS_URL), a Redis Sentinel group (REDIS_SENTINELS
and REDIS_SENTINEL_MASTER) that names the current primary and follows a failover to the promoted replica, or a
Redis Cluster (REDIS_CLUSTER=1) that REDIS_URL names one node of.

Pure parsing, no redis import (the client builders are batches/redis_clients.py's and worker/serve/redis_client.py's).
With sentinels, REDIS_URL still gives the primary's password, username, database number and TLS (`rediss://`);
its host and port are ignored: the sentinels name the primary, and every new connection asks them again.
"""

from __future__ import annotations

from dataclasses import dataclass

Address = tuple[str, int]


def parse_sentinels(raw: str) -> tuple[Address, ...]:
    """`host:port,host:port` -> ((host, port), ...); empty text -> (); a malformed entry raises ValueError
    naming it (an IPv6 host is written in brackets: `[::1]:26379`)."""
    found: list[Address] = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r} is not host:port with a port in 1..65535")
        found.append((host, int(port)))
    if len(set(found)) != len(found):
        raise ValueError("a sentinel is listed twice")
    return tuple(found)


@dataclass(frozen=True)
class RedisTarget:
    """The Redis a client dials: `url` alone, or the primary the `sentinels` name for the group `master`."""

    url: str
    sentinels: tuple[Address, ...] = ()
    master: str = "mymaster"
    cluster: bool = False  # REDIS_CLUSTER=1: `url` names one node of a Redis Cluster (a seed)

    @property
    def sentinel(self) -> bool:
        """True when the primary is found through Sentinel."""
        return bool(self.sentinels)

    def describe(self) -> str:
        """Where it points, for a log line (no password)."""
        if self.sentinel:
            return f"sentinel group {self.master!r} via " + ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return ("Redis Cluster via " if self.cluster else "") + self.url.rpartition("@")[2]
