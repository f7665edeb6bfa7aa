"""The Redis client builders of the gateway, the batch runner and (through worker/serve/redis_client.py) the
workers and node agents, their sockets bounded as shared/redis_sockets.py says, for one URL or a Sentinel group.

A command on a connection that a partition cut fails in COMMAND_TIMEOUT_S with redis-py's TimeoutError (the
connection closed; the next command dials afresh) instead of waiting until TCP gives up; a connection found dead
at send (Redis restarted) is redialled RETRIES times, a timeout never retried (the command may have run). The
rq worker's BLPOP blocks less than the timeout (batches/queue.py BatchWorker.dequeue_timeout). Built here, not
in worker/: the gateway imports batches, and must not import worker/.

With sentinels (shared/redis_target.py) every new connection asks them for the primary: after a failover the
connections to the dead primary fail as they did on a Redis restart (a ConnectionError, redialled by the same
retry), and the redial reaches the promoted replica; a demoted primary's READONLY reply closes the connection
and counts as a ConnectionError too (redis-py's SentinelManagedConnection). While the sentinels agree on no
primary (the failover window) a dial fails with MasterNotFoundError, a ConnectionError: "Redis unavailable".
"""

from __future__ import annotations

from typing import Any

import redis
from redis.asyncio import BlockingConnectionPool as AsyncBlockingPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.backoff import ExponentialBackoff
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry
from redis.sentinel import Sentinel

from shared.redis_sockets import RETRIES, RETRY_BASE_S, RETRY_CAP_S, SENTINEL_TIMEOUT_S, socket_options
from shared.redis_target import RedisTarget

Target = RedisTarget | str  # a bare string is a REDIS_URL


class BlockingSentinelPool(AsyncSentinelPool, AsyncBlockingPool):
    """The gateway's pool under Sentinel: a request waits for a free connection (as BlockingConnectionPool) and
    every connection dials the primary the sentinels name (as SentinelConnectionPool)."""


def _target(target: Target) -> RedisTarget:
    return target if isinstance(target, RedisTarget) else RedisTarget(target)


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), RETRIES, supported_errors=(RedisConnectionError,))


def async_retry() -> AsyncRetry:
    """The asyncio clients' retry: a connection found dead at send is redialled RETRIES times, a timeout never."""
    return AsyncRetry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), RETRIES,
                      supported_errors=(RedisConnectionError,))


def primary_options(target: RedisTarget) -> dict[str, Any]:
    """What REDIS_URL still says under Sentinel: password, username, database, TLS; not where the primary is."""
    options = {k: v for k, v in parse_url(target.url).items() if k not in ("host", "port", "connection_class")}
    if target.url.startswith("rediss://"):
        options["ssl"] = True
    return options


def _sentinel_kwargs() -> dict[str, Any]:
    """A sentinel that does not answer in SENTINEL_TIMEOUT_S is skipped for the next one."""
    return {"socket_timeout": SENTINEL_TIMEOUT_S, "socket_connect_timeout": SENTINEL_TIMEOUT_S}


def sync_client(target: Target, **extra: Any) -> redis.Redis:
    """rq's connection, the recovery scan's, a requeue's, the workers' (with `extra`): bounded sockets with TCP
    keepalive, redialled on a dead connection; the sentinels' primary when `target` names sentinels."""
    target = _target(target)
    options: dict[str, Any] = {**socket_options(target.url), "retry": _retry(),
                               "retry_on_error": [RedisConnectionError], **extra}
    if target.cluster:  # REDIS_CLUSTER: the URL is a seed node; the client finds the others and follows the slots
        options.pop("retry_on_error")  # the cluster client retries ConnectionError itself (its nodes may move)
        return redis.RedisCluster.from_url(target.url, **options)
    if not target.sentinel:
        return redis.Redis.from_url(target.url, **options)
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs())
    return sentinel.master_for(target.master, **primary_options(target), **options)


def async_client(target: Target, **extra: Any) -> AsyncRedis:
    """A batch run's client (the gateway's Broker runs on it): bounded sockets, no keepalive, as the gateway's
    own pool (shared/redis_sockets.py says why); the sentinels' primary when `target` names sentinels.
    `pool_class` and pool options in `extra` build the gateway's blocking pool."""
    target = _target(target)
    pool_class = extra.pop("pool_class", None)
    options: dict[str, Any] = {**socket_options(target.url, keepalive=False), "retry": async_retry(),
                               "retry_on_error": [RedisConnectionError], **extra}
    if target.cluster:  # a pool per node (max_connections each); no blocking pool: it waits on none
        options.pop("timeout", None)
        return AsyncRedisCluster.from_url(target.url, **options)
    if not target.sentinel:
        if pool_class is None:
            return AsyncRedis.from_url(target.url, **options)
        return AsyncRedis(connection_pool=pool_class.from_url(target.url, **options))
    sentinel = AsyncSentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs())
    sentinel_pool = BlockingSentinelPool if pool_class is not None else AsyncSentinelPool
    return sentinel.master_for(target.master, connection_pool_class=sentinel_pool, **primary_options(target),
                               **options)


MIN_CLUSTER_VERSION = (7, 0)  # sharded pub/sub (SPUBLISH, SSUBSCRIBE)


def old_cluster_nodes(versions: dict[str, str]) -> list[str]:
    """The nodes (name -> redis_version) older than MIN_CLUSTER_VERSION, as "host:port (version)"."""
    def parsed(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    return [f"{name} ({version})" for name, version in sorted(versions.items()) if parsed(version) < MIN_CLUSTER_VERSION]


def cluster_version_problem(versions: dict[str, str]) -> str | None:
    """The one line a process refuses to start with when a cluster node cannot run sharded pub/sub (None: fine)."""
    old = old_cluster_nodes(versions)
    if not old:
        return None
    return (f"REDIS_CLUSTER=1 needs Redis 7.0 or later on every node (sharded pub/sub); too old: {', '.join(old)}")


def cluster_versions(client: redis.RedisCluster) -> dict[str, str]:
    """Every node's redis_version (sync cluster client)."""
    return {node.name: str(client.info("server", target_nodes=node).get("redis_version", "0"))
            for node in client.get_nodes()}


async def async_cluster_versions(client: AsyncRedisCluster) -> dict[str, str]:
    """Every node's redis_version (asyncio cluster client; initializes it)."""
    await client.initialize()  # redis-py 8.1: a MULTI as an uninitialized async cluster client's first command fails
    return {node.name: str((await client.info("server", target_nodes=node)).get("redis_version", "0"))
            for node in client.get_nodes()}

