"""`llmfleet serve` on real processes: a dead worker or gateway is restarted, signals drain and stop it all.

Each test starts its own `serve --workers 2` (bundled Redis, gateway, two SmolLM2 workers with two slots
each, short heartbeats and leases) and drives it with the official openai client.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from llmfleet.redis_server import free_port
from tests.support.processes import http_json, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"


@dataclass
class Serve:
    """A running `llmfleet serve` and how to reach it."""

    process: subprocess.Popen[bytes]
    base_url: str
    log: Path

    def children(self) -> dict[int, str]:
        """pid -> command line of serve's children (gateway, batch runner, workers, redis-server)."""
        found = {}
        for pid in _child_pids(self.process.pid):
            with contextlib.suppress(OSError):
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return found

    def pids_of(self, role: str) -> list[int]:
        """Children whose command line names the role ('gateway', 'worker', 'redis-server')."""
        return [pid for pid, cmd in self.children().items()  # a zombie's command line is empty
                if cmd.split() and (role in cmd.split() or cmd.split()[0].endswith(role))]

    def ready(self) -> dict:
        """The gateway's /ready body ({} if it does not answer)."""
        return http_json(self.base_url + "/ready")


def _child_pids(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children += [int(p) for p in (task / "children").read_text().split()]
    return children


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


@pytest.fixture()
def serve(smollm2_gguf_path: Path, tmp_path: Path) -> Iterator[Serve]:
    """`llmfleet serve --workers 2` with short liveness settings; killed (whole tree) afterwards."""
    port = free_port()
    env = {**os.environ, "LLMFLEET_SLOTS": "2", "LLMFLEET_HEARTBEAT_INTERVAL_S": "0.5",
           "LLMFLEET_HEARTBEAT_TTL_S": "3", "LLMFLEET_LEASE_S": "4", "LLMFLEET_REGISTRY_CACHE_S": "0",
           "LLMFLEET_DRAIN_TIMEOUT_S": "30", "LLMFLEET_LOG_LEVEL": "INFO"}  # default float16 KV: resumes are exact
    env.pop("REDIS_URL", None)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "llmfleet.cli", "serve", "--workers", "2", "--port",
                                    str(port), "--model", MODEL], env=env, stdout=out, stderr=subprocess.STDOUT)
    running = Serve(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_until(lambda: running.ready().get("workers") == 2 or process.poll() is not None, 240, "serve to be ready")
        assert process.poll() is None, log.read_text()[-3000:]
        yield running
    finally:
        pids = list(running.children())
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@dataclass
class StreamOutcome:
    """What one streaming client saw."""

    text: str = ""
    chunks: int = 0
    finish: str | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _stream(base_url: str, prompt: str, max_tokens: int, outcome: StreamOutcome) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices:
                outcome.text += chunk.choices[0].text
                outcome.chunks += 1
                outcome.finish = chunk.choices[0].finish_reason or outcome.finish
    except (openai.APIError, httpx.HTTPError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.done.set()


def _start_streams(base_url: str, n: int, max_tokens: int) -> list[StreamOutcome]:
    outcomes = [StreamOutcome() for _ in range(n)]
    for i, outcome in enumerate(outcomes):
        threading.Thread(target=_stream, args=(base_url, f"Stream {i}: the history of tea", max_tokens, outcome),
                         daemon=True).start()
    return outcomes


def test_a_killed_worker_is_restarted_and_no_stream_notices(serve: Serve) -> None:
    """kill -9 one of two workers with streams on both: the other worker's streams are untouched, the dead
    one's are resumed (by the survivor or the restarted worker) and end byte-identical to an undisturbed run."""
    undisturbed = _start_streams(serve.base_url, 4, 120)
    for outcome in undisturbed:
        assert outcome.done.wait(120) and outcome.error is None
    workers = serve.pids_of("worker")
    assert len(workers) == 2
    outcomes = _start_streams(serve.base_url, 4, 120)  # two slots per worker: two streams on each
    wait_until(lambda: all(o.chunks >= 2 for o in outcomes), 120, "all four streams to be streaming")
    os.kill(workers[0], signal.SIGKILL)
    for outcome in outcomes:
        assert outcome.done.wait(120), "a stream hung"
    for before, after in zip(undisturbed, outcomes):
        assert after.error is None, after.error
        assert after.text == before.text and after.finish == "length"
    wait_until(lambda: len(serve.pids_of("worker")) == 2 and workers[0] not in serve.pids_of("worker"), 30,
          "a replacement worker process")
    wait_until(lambda: serve.ready().get("supervisor", {}).get("restarts") == 1 and serve.ready().get("workers") == 2,
          60, "the replacement to register (and the dead entry to expire)")
    assert serve.process.poll() is None
    log = serve.log.read_text()
    assert "worker-1 exited unexpectedly (signal SIGKILL)" in log or "worker-2 exited unexpectedly (signal SIGKILL)" in log


def test_a_killed_gateway_is_restarted(serve: Serve) -> None:
    outcome = _start_streams(serve.base_url, 1, 400)[0]
    wait_until(lambda: outcome.chunks >= 2, 60, "the stream to start")
    os.kill(serve.pids_of("gateway")[0], signal.SIGKILL)
    assert outcome.done.wait(60) and outcome.error is not None  # nothing else is possible for this client
    wait_until(lambda: serve.ready().get("ready") is True, 30, "the restarted gateway")
    fresh = StreamOutcome()
    _stream(serve.base_url, "a new request", 8, fresh)
    assert fresh.error is None and fresh.finish == "length"
    assert serve.process.poll() is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_lets_open_streams_finish_and_leaves_no_process(serve: Serve, signum: int) -> None:
    children = list(serve.children())
    assert len(children) == 5  # gateway, batch runner, two workers, redis-server
    assert len(serve.pids_of("batch-runner")) == 1
    outcomes = _start_streams(serve.base_url, 3, 120)
    wait_until(lambda: all(o.chunks >= 2 for o in outcomes), 120, "the streams to start")
    serve.process.send_signal(signum)
    for outcome in outcomes:
        assert outcome.done.wait(120)
        assert outcome.error is None and outcome.finish == "length", outcome.error
    assert serve.process.wait(timeout=90) == 0
    assert not [pid for pid in children if _alive(pid)], "a child outlived serve"


def test_serve_runs_batches_and_restarts_a_killed_batch_runner(serve: Serve) -> None:
    """A batch runs through serve's batch runner; kill -9 of the runner and the gateway mid-batch: serve restarts
    both, the new runner resumes the batch (after the lease time) and it completes with every line once."""
    client = openai.OpenAI(base_url=serve.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"Fact {i}:", "max_tokens": 24, "temperature": 0}}
             for i in range(10)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    batch = client.batches.create(input_file_id=client.files.create(file=("in.jsonl", data), purpose="batch").id,
                                  endpoint="/v1/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 2, 120, "the batch to start")
    [runner] = serve.pids_of("batch-runner")
    os.kill(runner, signal.SIGKILL)
    os.kill(serve.pids_of("gateway")[0], signal.SIGKILL)  # the gateway too: a batch lives in Redis only

    def completed() -> bool:
        try:
            return client.batches.retrieve(batch.id).status == "completed"
        except openai.APIConnectionError:  # the gateway is being restarted
            return False

    wait_until(completed, 240, "the resumed batch to complete")
    done = client.batches.retrieve(batch.id)
    assert done.request_counts.completed == 10 and done.request_counts.failed == 0
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert [item["custom_id"] for item in output] == [f"c{i}" for i in range(10)]
    log = serve.log.read_text()
    assert "batch-runner exited unexpectedly (signal SIGKILL)" in log and "gateway exited unexpectedly" in log
