"""A batch while its Redis (append-only file, as deployed) is stopped and started again: real redis-server,
gateway, SmolLM2 worker and batch runner processes. The batch completes with every line exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmfleet.redis_server import free_port, redis_server_binary
from tests.faults.process_cluster import MODEL, ready, wait_until
from tests.support.batches import start_batch_runner
from tests.support.cluster import process_cluster_redis

pytestmark = [pytest.mark.slow, pytest.mark.integration]


class PersistentRedis:
    """redis-server with an append-only file (fsync always) in a directory that outlives a restart."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.process = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
             "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _pings(client), 10, "redis-server")
        client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)  # no shutdown save: only what the AOF already holds
            self.process.wait()


def _pings(client: object) -> bool:
    try:
        return bool(client.ping())  # type: ignore[attr-defined]
    except Exception:
        return False


@pytest.fixture()
def cluster(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[tuple[PersistentRedis, str, Path]]:
    try:
        redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    server = PersistentRedis(tmp_path / "redis")
    server.directory.mkdir()
    server.start()
    running = process_cluster_redis(tmp_path, redis_url=server.url, LLMFLEET_HEARTBEAT_INTERVAL_S="0.5",
                                    LLMFLEET_HEARTBEAT_TTL_S="5", LLMFLEET_LEASE_S="8", LLMFLEET_BATCH_CONCURRENCY="3",
                                    LLMFLEET_BATCH_LEASE_S="10", LLMFLEET_LOG_LEVEL="INFO")
    try:
        running.start_gateway()
        running.start_worker()
        start_batch_runner(running)
        wait_until(lambda: ready(running.base_url).get("ready") is True, 240, "the gateway and the worker",
                   procs=running.procs)
        yield server, running.base_url, tmp_path
    finally:
        running.close()
        server.stop()


def test_a_batch_completes_across_a_redis_restart(cluster: tuple[PersistentRedis, str, Path]) -> None:
    server, base, logs = cluster
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=2, timeout=30)
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"Fact number {i}:", "max_tokens": 24, "temperature": 0}}
             for i in range(9)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    batch = client.batches.create(input_file_id=client.files.create(file=("in.jsonl", data), purpose="batch").id,
                                  endpoint="/v1/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 2, 120, "the batch to start")
    server.stop()
    time.sleep(3.0)  # Redis is away for 3 s (less than the batch lease)
    server.start()

    def completed() -> bool:
        try:
            return client.batches.retrieve(batch.id).status in ("completed", "failed")
        except openai.APIError:
            return False

    wait_until(completed, 240, "the batch to end")
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed", (done, (logs / "batch-runner.log").read_text()[-3000:])
    assert done.request_counts.total == 9 and done.request_counts.completed + done.request_counts.failed == 9
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    errors = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()] \
        if done.error_file_id else []
    assert sorted(item["custom_id"] for item in output + errors) == sorted(f"c{i}" for i in range(9))
    assert all(item["response"]["status_code"] in (503, 504) for item in errors), errors  # retryable, if any
    assert done.request_counts.completed >= 7  # at most the lines in flight at the restart can have failed
