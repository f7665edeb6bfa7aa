"""Per-key limits shared by every gateway: requests and tokens per minute, as GCRA in one Lua script.

Requests are counted when they arrive; tokens (prompt + completion) are charged when a request ends, and a
key whose token allowance is spent is refused until it has recovered (OpenAI's limits behave alike).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.http.api_keys import KeyRecord
from shared import keys

PERIOD_MS = 60_000
# KEYS[1]: the limit's state (its theoretical arrival time, ms); ARGV: period ms, limit, cost, now ms, force.
# Returns {allowed, retry_after_ms, remaining, reset_ms}. force=1 charges even past the limit (tokens used).
GCRA_SCRIPT = """
local period, limit, cost, now, force = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
    tonumber(ARGV[4]), ARGV[5] == '1'
local interval = period / limit
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + cost * interval
local allow_at = new_tat - period
if allow_at > now and not force then
  return {0, math.ceil(allow_at - now), 0, math.ceil(tat - now)}
end
if cost > 0 then
  redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil(new_tat - now) + 1000)
end
return {1, 0, math.max(0, math.floor((now + period - new_tat) / interval)), math.ceil(new_tat - now)}
"""


@dataclass(frozen=True)
class LimitState:
    """One limit's verdict: allowed or not, and what OpenAI's x-ratelimit-* headers say about it."""

    kind: str  # "requests" or "tokens"
    limit: int
    allowed: bool
    retry_after_s: float
    remaining: int
    reset_s: float

    def headers(self) -> dict[str, str]:
        """x-ratelimit-limit-*, -remaining-* and -reset-* of this limit."""
        return {f"x-ratelimit-limit-{self.kind}": str(self.limit),
                f"x-ratelimit-remaining-{self.kind}": str(self.remaining),
                f"x-ratelimit-reset-{self.kind}": f"{self.reset_s:.3g}s"}


def limit_key(name: str, kind: str) -> str:
    """The Redis key of one key's limit state."""
    return keys.rate_limit_key(name, kind)


class RateLimiter:
    """Checks and charges per-key limits through Redis (one script call each)."""

    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(GCRA_SCRIPT)

    async def admit(self, record: KeyRecord) -> list[LimitState]:
        """Count one request against the key's limits: a request, and no token debt (cost 0)."""
        states = []
        if record.rpm:
            states.append(await self._run(record, "requests", record.rpm, 1, force=False))
        if record.tpm:
            states.append(await self._run(record, "tokens", record.tpm, 0, force=False))
        return states

    async def charge_tokens(self, record: KeyRecord, tokens: int) -> None:
        """Charge the tokens a finished request used (past the limit too: later requests wait it out)."""
        if record.tpm and tokens > 0:
            await self._run(record, "tokens", record.tpm, tokens, force=True)

    async def _run(self, record: KeyRecord, kind: str, limit: int, cost: int, *, force: bool) -> LimitState:
        now_ms = int(time.time() * 1000)
        allowed, retry_ms, remaining, reset_ms = await self._script(
            keys=[limit_key(record.name, kind)], args=[PERIOD_MS, limit, cost, now_ms, int(force)])
        return LimitState(kind, limit, bool(allowed), math.ceil(int(retry_ms) / 1000), int(remaining),
                          int(reset_ms) / 1000)
