"""The worker's main Redis client: one thread-safe pool for the loop, the feeder, the publisher, the heartbeat and
the cancel listener, its sockets bounded as shared/redis_sockets.py says.

A command on a connection that a partition cut fails in COMMAND_TIMEOUT_S with redis-py's TimeoutError (its
connection closed); every thread that uses the client already treats a RedisError as "Redis away": it logs,
backs off and runs the command again, on a freshly dialled connection.
"""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from shared.redis_sockets import RETRIES, RETRY_BASE_S, RETRY_CAP_S, socket_options

HEALTH_CHECK_S = 30  # a connection idle this long is PINGed before its next command


def connect(redis_url: str) -> redis.Redis:
    """The worker's main client (connects lazily, at its first command)."""
    return redis.Redis.from_url(
        redis_url,
        **socket_options(redis_url),  # type: ignore[arg-type]
        health_check_interval=HEALTH_CHECK_S,
        # a connection found dead at send (Redis restarted) is redialled; a timeout is not retried (redis-py's
        # own default differs by version and constructor: none, or ten retries that each wait out the timeout)
        retry=Retry(ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S), RETRIES,
                    supported_errors=(RedisConnectionError,)),
        retry_on_error=[RedisConnectionError],
    )
