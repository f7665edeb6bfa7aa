"""The gateway's events subscriptions on a Redis Cluster (REDIS_CLUSTER=1): sharded pub/sub, one Subscriber per
primary.

A request's events channel carries its model's hash tag (shared/keys.py), so it lives in one slot, and SPUBLISH
reaches only the subscribers of the node that owns that slot. Each primary gets its own Subscriber
(gateway/cluster/subscriber.py, with SSUBSCRIBE): one connection per node, its own watchdog and re-dial, RESYNC
after a re-dial, exactly as with one Redis. A channel goes to the node that owns its slot when it is subscribed.

When a node's connection fails, its channels follow their slots: while any of them waits on a node that is not
connected, the cluster's slots are read again every FOLLOW_EVERY_S, and each channel whose slot another node owns
now (a replica the cluster promoted after its primary died) is subscribed there into the same queues, which then
receive RESYNC: what was published meanwhile is read back from the request's journal, which lives in the same
slot. A node left with no channel is closed. Not followed: a slot migrated by resharding while its node stays up
(the node ends the shard subscription; that stream's client gets the deadline's 504, or resumes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisError

from gateway.cluster.subscriber import RESYNC, QueueItem, Subscriber
from shared.errors import Unavailable
from shared.redis_sockets import socket_options

log = logging.getLogger(__name__)

FOLLOW_EVERY_S = 0.5  # while channels wait on a node that is not connected, the slots are read again this often

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
        on_error = options.pop("on_error", None) or (lambda: None)

        def failed() -> None:  # a node's connection failed: its channels may have to follow their slots
            on_error()
            self._recheck.set()

        self._options = {**options, "on_error": failed, "sharded": True}
        self._nodes: dict[str, Subscriber] = {}  # node name -> its subscriber
        self._clients: dict[str, Redis] = {}  # node name -> the client its subscriber dials
        self._where: dict[bytes, Subscriber] = {}  # channel -> the subscriber it was subscribed on
        self._recheck = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None
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
        self._follower = asyncio.create_task(self._follow(), name="llmfleet-slot-follower")

    async def close(self) -> None:
        """Stop following slots, every node's subscriber, and close their clients."""
        self._started = False
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        for node in self._nodes.values():
            await node.close()
        for client in self._clients.values():
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
            client = self._clients[node.name] = self._node_client(node.host, node.port)
            subscriber = self._nodes[node.name] = Subscriber(client, **self._options)
            if self._started:
                await subscriber.start()
        return subscriber

    def _stranded(self) -> list[str]:
        """The channels subscribed on a node whose connection is not up."""
        return [key.decode() for key, node in self._where.items() if not node.connected]

    async def _follow(self) -> None:
        """After a node's connection failed: while channels wait on a node that is not connected, read the slots
        again and move each channel whose slot another node owns now."""
        while True:
            await self._recheck.wait()
            self._recheck.clear()
            while self._stranded():
                with contextlib.suppress(RedisError, OSError):  # the cluster may still be electing a primary
                    await self._cluster.nodes_manager.initialize()
                    await self._move_stranded()
                await asyncio.sleep(FOLLOW_EVERY_S)

    async def _move_stranded(self) -> None:
        """Subscribe each stranded channel on its slot's owner now, into the same queues, and tell them RESYNC;
        close the subscribers of nodes left with no channel."""
        moved = 0
        for channel in self._stranded():
            old, owner = self._where[channel.encode()], await self._node_of(channel)
            if owner is old:
                continue
            listeners = old.listeners(channel)
            try:
                for queue in listeners:
                    await owner.subscribe(channel, queue)
            except Unavailable:  # the new owner does not answer yet: the next round tries again
                await owner.unsubscribe(channel)
                continue
            await old.unsubscribe(channel)  # not connected: only forgotten there
            self._where[channel.encode()] = owner
            for queue in listeners:
                queue.put_nowait(RESYNC)  # what was published meanwhile is read back from the journal
            moved += 1
        for name, node in list(self._nodes.items()):
            if not node.active and not node.connected:
                await node.close()
                del self._nodes[name]
                await self._clients.pop(name).aclose()
        if moved:
            log.warning("%d event channels followed their slots to a new primary; resyncing them from journals", moved)
