"""The gateway's events subscriptions on a Redis Cluster (REDIS_CLUSTER=1): sharded pub/sub, one Subscriber per
primary.

A request's events channel carries its model's hash tag (shared/keys.py), so it lives in one slot, and SPUBLISH
reaches only the subscribers of the node that owns that slot. Each primary gets its own Subscriber
(gateway/cluster/subscriber.py, with SSUBSCRIBE): one connection per node, its own watchdog and re-dial, RESYNC
after a re-dial, exactly as with one Redis. A channel goes to the node that owns its slot when it is subscribed.
Not followed: a slot that moves to another node while a request listens (resharding, or a replica promoted in the
cluster's own failover); such a stream goes silent, and its client gets the deadline's 504 (or resumes it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.connection import parse_url

from gateway.cluster.subscriber import QueueItem, Subscriber
from shared.redis_sockets import socket_options

NodeClient = Callable[[str, int], Redis]  # (host, port) -> a plain client of that node


def node_clients(url: str) -> NodeClient:
    """Plain clients of the cluster's nodes with REDIS_URL's password, username and TLS and the gateway's bounded
    sockets (the subscriber re-dials a lost connection itself)."""
    options = {k: v for k, v in parse_url(url).items() if k not in ("host", "port", "db", "connection_class")}
    if url.startswith("rediss://"):
        options["ssl"] = True
    return lambda host, port: Redis(host=host, port=port, **options, **socket_options(url, keepalive=False))


class ClusterSubscriber:
    """Subscriber's interface over a Redis Cluster: each channel is subscribed on the node owning its slot."""

    def __init__(self, cluster: RedisCluster, node_client: NodeClient, **options: Any) -> None:
        self._cluster = cluster
        self._node_client = node_client
        self._options = {**options, "sharded": True}
        self._nodes: dict[str, Subscriber] = {}  # node name -> its subscriber
        self._clients: list[Redis] = []
        self._where: dict[bytes, Subscriber] = {}  # channel -> the subscriber it was subscribed on
        self._started = False

    @property
    def active(self) -> int:
        """How many channels currently have a listener."""
        return sum(node.active for node in self._nodes.values())

    @property
    def reconnects(self) -> int:
        """How many times a node's connection was dropped and dialled again."""
        return sum(node.reconnects for node in self._nodes.values())

    async def start(self) -> None:
        """Learn the cluster's slots (the nodes' subscribers start as channels need them)."""
        await self._cluster.initialize()
        self._started = True

    async def close(self) -> None:
        """Stop every node's subscriber and close their clients."""
        self._started = False
        for node in self._nodes.values():
            await node.close()
        for client in self._clients:
            await client.aclose()
        self._nodes.clear()
        self._clients.clear()
        self._where.clear()

    def check_now(self) -> None:
        """Redis answers again: every node's subscriber dials at once (Subscriber.check_now)."""
        for node in self._nodes.values():
            node.check_now()

    async def subscribe(self, channel: str) -> asyncio.Queue[QueueItem]:
        """Listen on `channel` on the node owning its slot; returns its queue once that node confirmed."""
        node = await self._node_of(channel)
        queue = await node.subscribe(channel)
        self._where[channel.encode()] = node
        return queue

    async def unsubscribe(self, channel: str, queue: asyncio.Queue[QueueItem] | None = None) -> None:
        """Stop listening on `channel` (as Subscriber.unsubscribe). Never raises on Redis errors."""
        node = self._where.get(channel.encode())
        if node is None:
            return
        await node.unsubscribe(channel, queue)
        if not node.listens_to(channel):
            self._where.pop(channel.encode(), None)

    async def _node_of(self, channel: str) -> Subscriber:
        node = self._cluster.get_node_from_key(channel)
        subscriber = self._nodes.get(node.name)
        if subscriber is None:
            client = self._node_client(node.host, node.port)
            self._clients.append(client)
            subscriber = self._nodes[node.name] = Subscriber(client, **self._options)
            if self._started:
                await subscriber.start()
        return subscriber
