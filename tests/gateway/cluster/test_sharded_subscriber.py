"""The gateway's sharded subscriber on a Redis Cluster of processes with a replica per primary: when the primary
owning a request's slot is killed and the cluster promotes its replica, the channel follows its slot: the
listener's queue gets RESYNC (what was published meanwhile is in the journal), then what the new primary carries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisError

from gateway.cluster.sharded_subscriber import ClusterSubscriber, node_clients
from gateway.cluster.subscriber import RESYNC, QueueItem
from shared import keys
from tests.support.cluster_bed import ClusterBed, sharded_bed

pytestmark = [pytest.mark.slow, pytest.mark.integration]
CHANNEL = keys.events_channel("smollm2-135m", "r-1")


@pytest.fixture
def bed() -> Iterator[ClusterBed]:
    with sharded_bed(replicas=1) as running:
        yield running


async def _published_to_a_listener(client: RedisCluster, data: bytes, timeout_s: float) -> None:
    """SPUBLISH `data` until a subscriber received it (the cluster elects a new primary meanwhile)."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                if await client.spublish(CHANNEL, data):
                    return
            except (RedisError, OSError):
                pass  # the dead primary's slots are not served until its replica is promoted
            await asyncio.sleep(0.2)


async def _items_until(queue: asyncio.Queue[QueueItem], last: bytes, timeout_s: float) -> list[QueueItem]:
    """The queue's items up to and including `last`."""
    items: list[QueueItem] = []
    async with asyncio.timeout(timeout_s):
        while not items or items[-1] != last:
            items.append(await queue.get())
    return items


async def _follow_a_failover(bed: ClusterBed) -> tuple[int, int, list[QueueItem]]:
    nodes = [ClusterNode("127.0.0.1", port) for port in (*bed.ports, *bed.replica_ports)]
    client = RedisCluster(startup_nodes=nodes, socket_timeout=2)
    subscriber = ClusterSubscriber(client, node_clients(f"redis://127.0.0.1:{bed.ports[0]}/0"), ping_every_s=0.25,
                                   dead_after_s=1.0)
    try:
        await subscriber.start()
        queue = await subscriber.subscribe(CHANNEL)
        await _published_to_a_listener(client, b"before", 5)
        assert await _items_until(queue, b"before", 5) == [b"before"]
        owner = client.get_node_from_key(CHANNEL).port
        bed.kill_primary(bed.ports.index(owner))
        await _published_to_a_listener(client, b"after", 60)
        items = await _items_until(queue, b"after", 5)
        return owner, client.get_node_from_key(CHANNEL).port, items
    finally:
        await subscriber.close()
        await client.aclose()


def test_a_channel_follows_its_slot_to_the_promoted_replica(bed: ClusterBed) -> None:
    old, new, items = asyncio.run(_follow_a_failover(bed))
    assert new != old and new in bed.replica_ports  # the replica is the slot's primary now
    assert items == [RESYNC, b"after"]  # told to read the journal, then the new primary's events
