"""Gateway test fixtures: a FakeRedis server, the app with its lifespan, and a scriptable fake worker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import fakeredis
import httpx
import pytest
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import ResponseError

from gateway.app import create_app
from shared import codec, keys
from shared.fair_queue import release_fair
from shared.messages import (
    ChoiceEndEvent,
    DoneEvent,
    Event,
    FinishReason,
    Job,
    TokenEvent,
    Usage,
)
from shared.redis_commands import run_async
from shared.registry import RegistryEntry
from shared.settings import Settings
from tests.support.sse import split_ids
from worker.wire_commands import queue_registration

MODEL = "smollm2"


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only."""
    return "asyncio"


@pytest.fixture
def settings() -> Settings:
    """Settings for tests: no registry cache, short timeouts."""
    return Settings(
        registry_cache_s=0.0,
        request_timeout_s=5.0,
        deadline_grace_s=0.05,
        retry_after_s=2.0,
        queue_limit=4,
        orphan_grace_s=0.0,  # a client that leaves a stream has its job cancelled at once (tests of a grace set one)
    )


@pytest.fixture
def server() -> fakeredis.FakeServer:
    """One fake Redis server shared by the gateway and the fake workers."""
    return fakeredis.FakeServer()


@pytest.fixture
async def redis(server: fakeredis.FakeServer) -> AsyncIterator[fakeredis.FakeAsyncRedis]:
    """A client of the fake server (bytes responses, like the gateway's own)."""
    client = fakeredis.FakeAsyncRedis(server=server)
    yield client
    await client.aclose()


class FakeWorker:
    """Plays a worker: registers, takes jobs with XREADGROUP, journals and publishes events."""

    def __init__(self, redis: fakeredis.FakeAsyncRedis, model: str = MODEL, worker_id: str = "w1") -> None:
        self.redis = redis
        self.model = model
        self.worker_id = worker_id
        self.seq: dict[str, int] = {}
        self.entries: dict[str, tuple[str, bytes]] = {}  # request id -> (stream, entry id)

    async def register(self, **fields: Any) -> None:
        """Write a registry entry as a live worker does on each heartbeat (fields override)."""
        now = time.time()
        entry = RegistryEntry(worker_id=self.worker_id, model=self.model, slots=8, heartbeat=now, started=now)
        pipe = self.redis.pipeline(transaction=True)
        queue_registration(pipe, entry, ttl_s=10)
        if fields:
            pipe.hset(keys.worker_key(self.worker_id), mapping={k: str(v) for k, v in fields.items()})
        await pipe.execute()

    async def take(self, timeout: float = 3.0) -> Job:
        """The next job of this worker's model; checks the gateway subscribed before queueing it."""
        # highest priority first, its own (placed) jobs before the shared ones in a class, as workers read them
        streams = [s for pair in zip(keys.worker_jobs_streams(self.model, self.worker_id), keys.jobs_streams(self.model),
                                     strict=True) for s in pair]
        for stream in streams:
            try:
                await self.redis.xgroup_create(stream, keys.JOBS_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                assert "BUSYGROUP" in str(exc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # as a worker with room for one job of each class: the fair queues release into the shared streams
            await run_async(self.redis, release_fair(self.model, dict.fromkeys(keys.PRIORITY_ORDER, 1), maxlen=1000))
            got = None
            for stream in streams:
                got = await self.redis.xreadgroup(keys.JOBS_GROUP, self.worker_id, {stream: ">"}, count=1)
                if got:
                    break
            if got:
                entry_id, fields = got[0][1][0]
                job = codec.decode_job(fields[keys.JOB_FIELD.encode()])
                numsub = await self.redis.pubsub_numsub(keys.events_channel(job.model, job.id))
                assert numsub[0][1] == 1, "the gateway must subscribe before it queues the job"
                self.entries[job.id] = (got[0][0].decode(), entry_id)
                return job
            await asyncio.sleep(0.005)
        raise AssertionError("no job arrived")

    def next_seq(self, request_id: str) -> int:
        """The seq the next event of `request_id` gets."""
        seq = self.seq.get(request_id, 0)
        self.seq[request_id] = seq + 1
        return seq

    async def send(self, event: Event, *, journal: bool = True, publish: bool = True) -> None:
        """Journal then publish one event, in one MULTI/EXEC, as the worker contract says."""
        data = codec.encode_event(event)
        pipe = self.redis.pipeline(transaction=True)
        if journal:
            stream = keys.journal_stream(self.model, event.id)
            pipe.xadd(stream, {keys.JOURNAL_SEQ_FIELD: event.seq, keys.JOURNAL_EVENT_FIELD: data}, maxlen=1000)
            pipe.expire(stream, 60)
        if publish:
            pipe.publish(keys.events_channel(self.model, event.id), data)
        await pipe.execute()
        if isinstance(event, DoneEvent) or type(event).__name__ == "ErrorEvent":
            entry = self.entries.get(event.id)
            if entry is not None:
                await self.redis.xack(entry[0], keys.JOBS_GROUP, entry[1])
                await self.redis.xdel(entry[0], entry[1])

    async def token(self, job: Job, text: str, index: int = 0, **fields: Any) -> None:
        """Send one TokenEvent."""
        fields.setdefault("token_ids", [len(text)])
        await self.send(TokenEvent(id=job.id, seq=self.next_seq(job.id), index=index, text=text, **fields))

    async def end(self, job: Job, index: int = 0, reason: FinishReason = "stop") -> None:
        """Send one ChoiceEndEvent."""
        await self.send(ChoiceEndEvent(id=job.id, seq=self.next_seq(job.id), index=index, finish_reason=reason))

    async def done(self, job: Job, prompt_tokens: int = 3, completion_tokens: int = 2, **fields: Any) -> None:
        """Send the terminal DoneEvent."""
        usage = Usage(
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
        )
        await self.send(DoneEvent(id=job.id, seq=self.next_seq(job.id), usage=usage, **fields))

    async def answer(self, job: Job, texts: list[str], reason: FinishReason = "stop") -> None:
        """Tokens, choice end and done for a one-choice job."""
        for text in texts:
            await self.token(job, text)
        await self.end(job, reason=reason)
        await self.done(job, completion_tokens=len(texts))


@pytest.fixture
def make_worker(redis: fakeredis.FakeAsyncRedis) -> Callable[..., FakeWorker]:
    """Build more (unregistered) fake workers: make_worker(model=..., worker_id=...)."""
    return lambda **kwargs: FakeWorker(redis, **kwargs)


@pytest.fixture
async def worker(redis: fakeredis.FakeAsyncRedis) -> FakeWorker:
    """A registered, live fake worker for MODEL."""
    fake = FakeWorker(redis)
    await fake.register()
    return fake


@pytest.fixture
async def app_client(
    settings: Settings, server: fakeredis.FakeServer
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The gateway app (lifespan running, its own FakeRedis client) and an HTTP client for it."""
    gateway_redis = fakeredis.FakeAsyncRedis(
        server=server, connection_pool_class=BlockingConnectionPool, max_connections=settings.redis_max_connections
    )
    app = create_app(settings, redis=gateway_redis)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield app, client
    await gateway_redis.aclose()


@pytest.fixture
def client(app_client: tuple[Any, httpx.AsyncClient]) -> httpx.AsyncClient:
    """The HTTP client of the running gateway."""
    return app_client[1]


def sse_payloads(body: bytes) -> list[Any]:
    """The JSON payloads of an SSE body ([DONE] as the string '[DONE]'); asserts the framing."""
    assert body.endswith(b"\n\n")
    out: list[Any] = []
    ids, blocks = split_ids(body.decode())
    assert ids == list(range(len(ids)))  # a resumable stream numbers its events 0, 1, ...
    for block in blocks:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
def fixed_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Request ids req-0123, req-0124, ... (tests that assert on ids and the bodies built from them)."""
    import itertools

    from gateway.replies import serving

    ids = itertools.count(123)
    monkeypatch.setattr(serving, "new_request_id", lambda: f"req-{next(ids):04d}")
