"""Turn Redis client failures into the one error the client sees: 503 Unavailable with Retry-After."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

from shared.errors import Unavailable


@contextmanager
def redis_unavailable(retry_after: float) -> Iterator[None]:
    """Re-raise Redis and socket errors inside the block as Unavailable (503)."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise Unavailable(
            f"the queue service (Redis) cannot be reached ({type(exc).__name__}); please retry",
            retry_after=retry_after,
        ) from exc
