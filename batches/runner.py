"""Execute one batch: `run_batch` (what the rq job in batches/queue.py calls) and what it does.

1. Take the batch's lease (SET NX PX LLMFLEET_BATCH_LEASE_S); if another runner holds it, do nothing.
2. 'validating' -> 'in_progress'; read and parse the input file; skip the lines that already have a result
   (a resumed batch continues where its dead runner stopped).
3. Run the remaining lines, LLMFLEET_BATCH_CONCURRENCY at a time, each through the normal job path at
   priority low (batches/execute.py), recording each result as it finishes (the counts go up with it).
   Every LEASE_S / 3 it renews the lease and looks at the batch: 'cancelling' stops it (in-flight requests
   are cancelled in the workers), the end of the completion window expires it, a SIGTERM to the runner
   stops it ("stopped": the rq job puts it back in the queue for the next runner).
4. Write the output and error files in input order and end the batch (completed, cancelled, expired, or
   failed when its runners died more than LLMFLEET_MAX_DELIVERIES times).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from batches import objects
from batches.execute import run_line
from batches.files import FileStore
from batches.input import BatchLine, parse_input
from batches.redis_clients import async_client
from batches.store import BatchStore
from gateway.cluster.broker import Broker
from gateway.cluster.registry import Registry
from gateway.cluster.warm_pool import WarmPool
from gateway.http.tenants import requested_tenant
from shared import keys
from shared.errors import InvalidRequest, NotFound
from shared.settings import Settings

log = logging.getLogger(__name__)

REDIS_RETRY_S = 0.5
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def run_batch(batch_id: str, settings: Settings, *, heartbeat: Callable[[], None] | None = None,
              stop: threading.Event | None = None) -> str:
    """Execute (or resume) one batch; returns its outcome ("stopped" when `stop` was set: the caller, the rq
    job in batches/queue.py, puts it back in the queue)."""
    return asyncio.run(BatchRun(batch_id, settings, heartbeat=heartbeat, stop=stop).run())


class BatchRun:
    """One runner's execution of one batch, under its lease."""

    def __init__(self, batch_id: str, settings: Settings, *, heartbeat: Callable[[], None] | None = None,
                 stop: threading.Event | None = None) -> None:
        self.batch_id = batch_id
        self.settings = settings
        self.heartbeat = heartbeat  # refreshes the heartbeats of the rq worker running us
        self.stop = stop or threading.Event()  # set when this runner process is asked to stop (SIGTERM)
        self.runner_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.lease_ms = int(settings.batch_lease_s * 1000)
        self.renewed_at = time.monotonic()  # when the lease was last taken or renewed

    async def run(self) -> str:
        """Run the batch to its end, or until it is stopped; returns the outcome."""
        redis = async_client(self.settings.redis_target)  # bounded sockets (batches/redis_clients.py)
        try:
            if not await redis.set(keys.batch_lease(self.batch_id), self.runner_id, nx=True, px=self.lease_ms):
                log.info("batch %s is held by another runner", self.batch_id)
                return "held"
            try:
                return await self._run(redis)
            finally:
                with contextlib.suppress(Exception):
                    await redis.eval(RELEASE, 1, keys.batch_lease(self.batch_id), self.runner_id)
        finally:
            await redis.aclose()

    async def _run(self, redis: Redis) -> str:
        store, files = BatchStore(redis), FileStore(redis)
        try:
            fields = await store.fields(self.batch_id)
        except NotFound:
            await redis.srem(keys.BATCHES_ACTIVE, self.batch_id)
            return "gone"
        status = fields["status"]
        if status in objects.TERMINAL_STATUSES:
            return status
        if int(fields.get("attempts") or 0) > self.settings.max_deliveries:
            await self._fail(store, "batch_runner_died", f"the runners executing this batch died "
                             f"{fields['attempts']} times; the lines that finished are in its files")
            return "failed"
        if status == "cancelling":
            await store.finish(self.batch_id, "cancelled")
            return "cancelled"
        if status == "validating":
            await store.transition(self.batch_id, "in_progress", allowed_from=("validating",))
        try:
            lines = parse_input(await files.content(fields["input_file_id"]),
                                max_lines=self.settings.max_batch_lines, max_body_bytes=self.settings.max_body_bytes)
        except (NotFound, InvalidRequest) as exc:
            await self._fail(store, "invalid_input_file", exc.message)
            return "failed"
        done = await store.done_lines(self.batch_id)
        pending = [line for line in lines if line.index not in done]
        log.info("batch %s: %d lines, %d to run", self.batch_id, len(lines), len(pending))
        outcome = await self._run_lines(redis, store, pending, float(fields["expires_at"]))
        if outcome == "done":
            status = await store.transition(self.batch_id, "finalizing", allowed_from=("in_progress",))
            outcome = "cancelled" if status == "cancelling" else "completed"
        if outcome == "expired":
            await self._expire_rest(store, lines)
        if outcome in ("completed", "cancelled", "expired"):
            await store.finish(self.batch_id, outcome)
        log.info("batch %s: %s", self.batch_id, outcome)
        return outcome

    async def _run_lines(self, redis: Redis, store: BatchStore, pending: list[BatchLine], expires_at: float) -> str:
        """Run the lines with bounded concurrency; 'done', or why it stopped early."""
        queue: asyncio.Queue[BatchLine] = asyncio.Queue()
        for line in pending:
            queue.put_nowait(line)
        registry = Registry(redis, self.settings)  # as gateway/app.py builds them: admission reads both
        broker = Broker(redis, self.settings, registry, WarmPool(redis, self.settings, registry))
        await broker.start()
        requested_tenant.set(f"batch {self.batch_id}")  # its lines share their class fairly with other tenants

        async def work() -> None:
            while not queue.empty():
                line = queue.get_nowait()
                ok, text = await run_line(broker, registry, self.settings, line)
                await self._record(store, line.index, ok, text)

        tasks = [asyncio.create_task(work()) for _ in range(min(self.settings.batch_concurrency, len(pending)))]
        everything = asyncio.gather(*tasks)
        outcome = "done"
        try:
            while not everything.done():
                await asyncio.wait({everything}, timeout=self.settings.batch_lease_s / 3)
                reason = await self._check(redis, store, expires_at)
                if reason is not None:
                    outcome = reason
                    break
            if outcome == "done":
                everything.result()  # a broken worker task is a bug: let rq see it
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await broker.close()
        return outcome

    async def _record(self, store: BatchStore, index: int, ok: bool, text: str) -> None:
        """Keep a line's result; while Redis is away, retry for as long as the lease would still be ours."""
        while True:
            try:
                await store.record(self.batch_id, index, ok, text)
                return
            except (RedisError, OSError):
                if time.monotonic() - self.renewed_at > self.settings.batch_lease_s:
                    raise
                await asyncio.sleep(REDIS_RETRY_S)

    async def _check(self, redis: Redis, store: BatchStore, expires_at: float) -> str | None:
        """Renew the lease; why the batch must stop now (lost, stopped, cancelled, expired), or None.

        Redis away for less than the lease changes nothing (the lease cannot have passed to another runner);
        longer, and the run stops as if the lease were lost (the batch is resumed once Redis is back)."""
        try:
            renewed = await redis.eval(RENEW, 1, keys.batch_lease(self.batch_id), self.runner_id, self.lease_ms)
            status = (await store.fields(self.batch_id))["status"]
        except (RedisError, OSError) as exc:
            if time.monotonic() - self.renewed_at > self.settings.batch_lease_s:
                log.warning("batch %s: Redis unreachable for longer than the lease; leaving it", self.batch_id)
                return "lost"
            log.warning("batch %s: Redis unreachable (%s); going on", self.batch_id, type(exc).__name__)
            return None
        if not renewed:
            log.warning("batch %s: lease lost to another runner; leaving it", self.batch_id)
            return "lost"
        self.renewed_at = time.monotonic()
        if self.heartbeat is not None:
            with contextlib.suppress(RedisError, OSError):
                await asyncio.to_thread(self.heartbeat)
        if self.stop.is_set():
            return "stopped"
        if status == "cancelling":
            return "cancelled"
        if time.time() >= expires_at:
            return "expired"
        return None

    async def _expire_rest(self, store: BatchStore, lines: list[BatchLine]) -> None:
        done = await store.done_lines(self.batch_id)
        for line in lines:
            if line.index not in done:
                text = objects.unexecuted_line(f"batch_req_{secrets.token_hex(16)}", line.custom_id, "batch_expired",
                                               "This request could not be executed before the completion window expired.")
                await store.record(self.batch_id, line.index, False, text)

    async def _fail(self, store: BatchStore, code: str, message: str) -> None:
        log.warning("batch %s failed: %s", self.batch_id, code)
        await store.finish(self.batch_id, "failed", errors=objects.batch_errors(code, message))
