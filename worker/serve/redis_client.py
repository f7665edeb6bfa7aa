"""The worker's main Redis client: one thread-safe pool for the loop, the feeder, the publisher, the heartbeat and
the cancel listener, its sockets bounded as shared/redis_sockets.py says (node agents use it too).

A command on a connection that a partition cut fails in COMMAND_TIMEOUT_S with redis-py's TimeoutError (its
connection closed); every thread that uses the client already treats a RedisError as "Redis away": it logs,
backs off and runs the command again, on a freshly dialled connection. Under Sentinel (REDIS_SENTINELS) that
fresh connection dials the primary the sentinels name, so the same handling carries a worker over a failover
(batches/redis_clients.py builds the client for both cases).
"""

from __future__ import annotations

import redis

from batches.redis_clients import sync_client
from shared.redis_target import RedisTarget

HEALTH_CHECK_S = 30  # a connection idle this long is PINGed before its next command


def connect(target: RedisTarget | str) -> redis.Redis:
    """The worker's main client (connects lazily, at its first command): REDIS_URL, or the sentinels' primary."""
    # a connection found dead at send (Redis restarted, the primary failed over) is redialled; a timeout is not
    # retried (redis-py's own default differs by version and constructor: none, or ten retries that each wait
    # out the timeout)
    return sync_client(target, health_check_interval=HEALTH_CHECK_S)
