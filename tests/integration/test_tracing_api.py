"""OpenTelemetry traces on a real cluster: a streamed chat request's spans reach a real OTLP/HTTP receiver process
(tests/support/otlp_receiver.py) as one trace, gateway span at the root, queue wait and worker span under it,
admission, prefill and decode under the worker's, with the GenAI attributes and no prompt or completion text."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmfleet.local_cluster import LocalCluster
from llmfleet.redis_server import free_port
from tests.support.cluster import MODEL, start_process_cluster
from tests.support.otlp_receiver import read_spans

pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed (pip install '.[otel]')")
pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Name one colour of the sea at dawn."


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """An OTLP/HTTP receiver process and a one-worker cluster exporting to it; (cluster, the receiver's spans file)."""
    logdir = tmp_path_factory.mktemp("tracing")
    port, spans = free_port(), logdir / "spans.jsonl"
    receiver = subprocess.Popen([sys.executable, "-m", "tests.support.otlp_receiver", str(port), str(spans)], cwd=ROOT)
    try:
        cluster = start_process_cluster(logdir, 1, LLMFLEET_HOST="127.0.0.1", LLMFLEET_LOG_LEVEL="WARNING",
                                        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                                        OTEL_BSP_SCHEDULE_DELAY="100", OTEL_RESOURCE_ATTRIBUTES="deployment=test")
        try:
            yield cluster, spans
        finally:
            cluster.close()
    finally:
        receiver.kill()
        receiver.wait()


def _trace(spans_file: Path, response_id: str, wanted: int) -> list[dict[str, Any]]:
    """The spans of the trace whose gateway span answered `response_id`, once `wanted` of them arrived."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        spans = read_spans(spans_file)
        roots = [s for s in spans if s["attributes"].get("gen_ai.response.id") == response_id
                 and s["service"] == "llmfleet-gateway"]
        if roots:
            mine = [s for s in spans if s["trace_id"] == roots[0]["trace_id"]]
            if len(mine) >= wanted:
                return mine
        time.sleep(0.1)
    raise AssertionError(f"no whole trace of {response_id} arrived: {read_spans(spans_file)}")


def test_a_streamed_chat_request_is_one_trace_through_gateway_queue_and_worker(traced: Any) -> None:
    cluster, spans_file = traced
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    request_id = chunks[0].id.removeprefix("chatcmpl-")
    spans = _trace(spans_file, f"req-{request_id}" if not request_id.startswith("req-") else request_id, 6)
    by_name = {s["name"]: s for s in spans}
    root = by_name[f"chat {MODEL}"]
    assert root["service"] == "llmfleet-gateway" and root["parent_span_id"] == "" and root["kind"] == 2  # SERVER
    worker = by_name[f"worker {MODEL}"]
    assert by_name["queue wait"]["parent_span_id"] == worker["parent_span_id"] == root["span_id"]
    assert worker["service"] == "llmfleet-worker"
    for phase in ("admission", "prefill", "decode"):
        assert by_name[phase]["parent_span_id"] == worker["span_id"]
    assert by_name["admission"]["end"] <= by_name["prefill"]["start"] + 1_000_000  # in order (ms rounding)
    assert by_name["prefill"]["end"] <= by_name["decode"]["start"] + 1_000_000
    usage = chunks[-1].usage
    for span in (root, worker):
        assert span["attributes"]["gen_ai.usage.output_tokens"] == usage.completion_tokens
        assert span["attributes"]["gen_ai.usage.input_tokens"] == usage.prompt_tokens
        assert span["attributes"]["gen_ai.operation.name"] == "chat"
    assert root["attributes"]["gen_ai.request.max_tokens"] == 8 and root["attributes"]["gen_ai.request.stream"]
    assert root["attributes"]["gen_ai.response.finish_reasons"] == [chunks[-2].choices[0].finish_reason]
    assert root["attributes"]["http.response.status_code"] == 200
    dumped = spans_file.read_text()
    assert PROMPT not in dumped and "colour" not in dumped  # no prompt text
    assert len(text.strip()) < 4 or text.strip() not in dumped  # no completion text
