"""Prefix-aware placement: send a request to the worker that has its prompt prefix cached, when it has room.

The gateway does not tokenize, so the prefix key is a hash chain over the request's text: the canonical text
of the prompt (tools, then each message as role + content, or the completion prompt, or its token ids) is cut
into CHUNK_CHARS-character chunks, and hash i covers chunks 0..i (h_i = sha256(h_{i-1} + chunk_i)). Two
prompts that share their first k*CHUNK_CHARS characters share the first k hashes, whatever the tokenizer does;
a partial last chunk is left out (like the worker's prefix cache, which keeps full blocks only). CHUNK_CHARS is
about 64 tokens, i.e. two KV blocks.

`llmfleet:{model}:prefix:{h_i}` = the worker that last got a prompt with that prefix (EX LLMFLEET_PREFIX_TTL_S).
A worker's load (`busy`) is the jobs it holds (its pending entries on the model's streams) plus the jobs placed on
its own streams and not yet taken, counted in Redis as the job is placed: gateway/cluster/placer.py runs this
choice as one script (shared/placing.py PLACE_SCRIPT) that counts, chooses and writes the job in one step, so every
placement of every gateway counts every earlier one, and a worker's stale heartbeat counts for nothing. `choose`
is that rule in Python (the script is tested to agree with it).
choose():
  1. fewer than two live workers: the shared stream (nothing to choose);
  2. no full chunk (a short prompt, nothing to reuse): the least busy worker with room (ties: rendezvous hash
     of the request id), so a burst of short prompts spreads instead of being read by whichever worker
     reads the shared stream first;
  3. imbalance guard (as SGLang's cache-aware router): when busy (running + placed and not yet taken) differs
     by more than LLMFLEET_PLACEMENT_BALANCE_ABS and the busiest has over BALANCE_REL times the least busy's,
     the least busy worker with room wins, cache or not;
  4. the deepest hash whose worker is live and below its slot count wins; when that worker is full or gone, the
     least busy worker with room on the same host KV tier (registry `kv_tier`: the host and tier directory; the
     prefix map's value carries it, so a dead worker's host is known) wins, since it copies the prefix's blocks
     from the tier instead of prefilling them (reason "tier");
  5. else the least busy worker with room (ties: rendezvous hash of the first chunk, so a new prefix goes to
     the same worker from every gateway); no worker with room: the shared stream, which whoever frees a slot
     first reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from redis.asyncio import Redis

from shared import keys
from shared.messages import GenerateJob, Job

CHUNK_CHARS = 256
MAX_CHUNKS = 64  # the chain covers at most the first 16 KiB characters (bounded work and map writes)
BALANCE_REL = 1.5
HASH_CHARS = 32  # hex characters of a chain hash kept in the key
TIER_SEP = "\x1f"  # a prefix map value is "worker_id" or "worker_id<TIER_SEP>kv_tier"


@dataclass(frozen=True)
class Candidate:
    """A live worker of the model as placement sees it."""

    worker_id: str
    slots: int
    running: int  # jobs it holds (taken, not acked)
    queued: int  # jobs placed on its own streams and not taken yet
    tier: str = ""  # its host KV tier ("" = none): workers with the same one share their prefixes' blocks

    @property
    def busy(self) -> int:
        """Work it has or is about to have."""
        return self.running + self.queued

    @property
    def has_room(self) -> bool:
        """Whether one more job would start at once."""
        return self.busy < self.slots


@dataclass(frozen=True)
class Choice:
    """Where one job goes: a worker id (its per-worker stream) or None (the shared stream), and why."""

    worker_id: str | None
    reason: str  # "single", "short", "balance", "hit", "new", "full", "off"
    depth: int = 0  # chunks of the prefix the chosen worker is known to have (hit only)
    tier: str = ""  # the chosen worker's host KV tier (recorded with it in the prefix map)


def prompt_text(job: GenerateJob) -> str:
    """The canonical text whose chunks key the prefix map (never logged)."""
    parts: list[str] = []
    if job.tools and job.tool_choice != "none":
        parts.append(msgspec.json.encode(job.tools).decode())
    if job.messages is not None:
        for message in job.messages:
            parts.append(f"\x1e{message.role}\x1f{message.content}")
    elif job.prompt is not None:
        parts.append(job.prompt)
    elif job.prompt_token_ids is not None:
        parts.append(",".join(map(str, job.prompt_token_ids)))
    return "".join(parts)


def prefix_chain(text: str, *, chunk_chars: int = CHUNK_CHARS, max_chunks: int = MAX_CHUNKS) -> list[str]:
    """The hash chain over the full chunks of `text` (shortest prefix first)."""
    chain: list[str] = []
    previous = b""
    for start in range(0, min(len(text) // chunk_chars, max_chunks) * chunk_chars, chunk_chars):
        digest = hashlib.sha256(previous + text[start:start + chunk_chars].encode()).hexdigest()[:HASH_CHARS]
        chain.append(digest)
        previous = digest.encode()
    return chain


def rendezvous(worker_id: str, seed: str) -> str:
    """The worker's rendezvous hash on `seed` (the lowest wins a tie: every gateway breaks it the same way)."""
    return hashlib.sha256(f"{seed}/{worker_id}".encode()).hexdigest()


def least_busy(candidates: Sequence[Candidate], seed: str) -> Candidate | None:
    """The least busy candidate with room (ties broken by rendezvous hashing on `seed`); None if all are full."""
    roomy = [c for c in candidates if c.has_room]
    if not roomy:
        return None
    return min(roomy, key=lambda c: (c.busy, rendezvous(c.worker_id, seed)))


def imbalanced(candidates: Sequence[Candidate], balance_abs: int) -> bool:
    """Whether loads diverge enough that the shortest queue beats the cache."""
    loads = [c.busy for c in candidates]
    return max(loads) - min(loads) > balance_abs and max(loads) > BALANCE_REL * min(loads)


def choose(candidates: Sequence[Candidate], chain: Sequence[str], owners: Sequence[str | None], *,
           balance_abs: int, request_id: str = "") -> Choice:
    """Pick the worker for a job whose prefix chain is `chain`; owners[i] is who last got chain[i] (or None);
    `request_id` breaks ties between equally busy workers for a prompt too short to have a chain."""
    if len(candidates) < 2:
        return Choice(None, "single")
    if not chain:
        target = least_busy(candidates, request_id)
        return Choice(target.worker_id if target else None, "short" if target else "full")
    seed = chain[0]
    if imbalanced(candidates, balance_abs):
        target = least_busy(candidates, seed)
        return Choice(target.worker_id if target else None, "balance" if target else "full")
    by_id = {c.worker_id: c for c in candidates}
    for depth in range(len(owners), 0, -1):
        owner, _, tier = (owners[depth - 1] or "").partition(TIER_SEP)
        candidate = by_id.get(owner) if owner else None
        if candidate is not None and candidate.has_room:
            return Choice(candidate.worker_id, "hit", depth, candidate.tier)
        tier = candidate.tier if candidate is not None else tier
        mate = least_busy([c for c in candidates if c.tier == tier], seed) if tier else None
        if mate is not None:
            return Choice(mate.worker_id, "tier", depth, mate.tier)
    target = least_busy(candidates, seed)
    return Choice(target.worker_id if target else None, "new" if target else "full", 0,
                  target.tier if target else "")


class PrefixMap:
    """The prefix-hash -> worker map in Redis."""

    def __init__(self, redis: Redis, *, ttl_s: float) -> None:
        self._redis = redis
        self._ttl_ms = max(1, int(ttl_s * 1000))

    async def owners(self, model: str, chain: Sequence[str]) -> list[str | None]:
        """Who last got each prefix of the chain (None where nobody, or the entry expired)."""
        if not chain:
            return []
        values = await self._redis.mget([keys.prefix_owner(model, h) for h in chain])
        return [v.decode(errors="replace") if v else None for v in values]

    @property
    def ttl_ms(self) -> int:
        """How long an entry is kept (milliseconds)."""
        return self._ttl_ms


def placeable(job: Job) -> GenerateJob | None:
    """The job when placement applies to it (generation jobs; embeddings and text jobs take the shared stream)."""
    return job if isinstance(job, GenerateJob) else None
