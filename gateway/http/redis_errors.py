"""Turn Redis client failures into the one error the client sees: 503 Unavailable with Retry-After, whose message
says what happened: Redis answered and refused the write (full, read-only, a failed save: shared/redis_commands.py
`describe_refusal`), or it could not be reached."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

from shared.errors import Unavailable
from shared.redis_commands import describe_refusal


def unavailable_message(exc: BaseException) -> str:
    """The 503's message for a Redis failure: what Redis said when it refused a write, else that it cannot be
    reached."""
    refusal = describe_refusal(exc)
    if refusal is not None:
        return f"the queue service refuses writes: {refusal}; please retry"
    return f"the queue service (Redis) cannot be reached ({type(exc).__name__}); please retry"


@contextmanager
def redis_unavailable(retry_after: float) -> Iterator[None]:
    """Re-raise Redis and socket errors inside the block as Unavailable (503)."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise Unavailable(unavailable_message(exc), retry_after=retry_after) from exc
