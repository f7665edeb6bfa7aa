"""The batch runner's Redis clients, their sockets bounded as the main pools' are (shared/redis_sockets.py).

A command on a connection that a partition cut fails in COMMAND_TIMEOUT_S with redis-py's TimeoutError (the
connection closed; the next command dials afresh) instead of waiting until TCP gives up; a connection found dead
at send (Redis restarted) is redialled RETRIES times, a timeout never retried (the command may have run). The
rq worker's BLPOP blocks less than the timeout (batches/queue.py BatchWorker.dequeue_timeout). Built here, not
with the worker's builder: the gateway imports batches, and must not import worker/.
"""

from __future__ import annotations

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from shared.redis_sockets import RETRIES, RETRY_BASE_S, RETRY_CAP_S, socket_options


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), RETRIES, supported_errors=(RedisConnectionError,))


def sync_client(redis_url: str) -> redis.Redis:
    """rq's connection, the recovery scan's, a requeue's: bounded sockets with TCP keepalive (as the workers')."""
    return redis.Redis.from_url(redis_url, **socket_options(redis_url),  # type: ignore[arg-type]
                                retry=_retry(), retry_on_error=[RedisConnectionError])


def async_client(redis_url: str) -> AsyncRedis:
    """A batch run's client (the gateway's Broker runs on it): bounded sockets, no keepalive, as the gateway's
    own pool (shared/redis_sockets.py says why)."""
    return AsyncRedis.from_url(redis_url, **socket_options(redis_url, keepalive=False),  # type: ignore[arg-type]
                               retry=_retry(), retry_on_error=[RedisConnectionError])
