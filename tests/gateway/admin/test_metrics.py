"""GET /metrics: this gateway's request metrics change by exactly what was served; the fleet's workers and
queues appear from the registry (any gateway sees every worker)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.messages import Timing

pytestmark = pytest.mark.anyio


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def _chat(client: httpx.AsyncClient, stream: bool = False) -> httpx.Response:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    return await client.post("/v1/chat/completions", json=body)


async def test_requests_tokens_and_latencies_are_counted(client: httpx.AsyncClient, worker: Any) -> None:
    before = await scrape(client)
    for stream in (False, True, False):
        task = asyncio.create_task(_chat(client, stream))
        job = await worker.take()
        for text in ("a", "b", "c"):
            await worker.token(job, text)
        await worker.end(job, reason="length")
        await worker.done(job, prompt_tokens=7, completion_tokens=3,
                          timing=Timing(queue_s=0.2, first_token_s=0.3, total_s=0.5))
        assert (await task).status_code == 200
    after = await scrape(client)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("llmfleet_request_success_total", model="smollm2", finish_reason="length") == 3
    assert grew("llmfleet_prompt_tokens_total", model="smollm2") == 21
    assert grew("llmfleet_generation_tokens_total", model="smollm2") == 9
    for histogram in ("llmfleet_time_to_first_token_seconds", "llmfleet_inter_token_latency_seconds",
                      "llmfleet_e2e_request_latency_seconds", "llmfleet_request_queue_time_seconds"):
        assert grew(histogram + "_count", model="smollm2") == 3, histogram
    assert grew("llmfleet_request_queue_time_seconds_sum", model="smollm2") == pytest.approx(0.6)
    assert value(after, "llmfleet_gateway_requests_in_flight") == 0


async def test_failures_are_counted_by_code(client: httpx.AsyncClient, worker: Any) -> None:
    from shared.messages import ErrorEvent

    task = asyncio.create_task(_chat(client))
    job = await worker.take()
    await worker.send(ErrorEvent(id=job.id, seq=worker.next_seq(job.id), status=400, type="invalid_request_error",
                                 code="context_length_exceeded", param="messages", message="too long"))
    assert (await task).status_code == 400
    samples = await scrape(client)
    assert value(samples, "llmfleet_request_failure_total", model="smollm2", code="context_length_exceeded") == 1


async def test_every_live_worker_and_queue_depth_appear(client: httpx.AsyncClient, make_worker: Any) -> None:
    one, two = make_worker(worker_id="w-a"), make_worker(worker_id="w-b", model="gemma3-270m")
    await one.register(**{"stat.active": 3, "stat.kv_blocks_used": 25, "stat.kv_blocks_total": 100,
                          "stat.prefix_queries": 10, "stat.prefix_hits": 4, "stat.preemptions": 2})
    await two.register(**{"stat.generated_tokens": 512})
    samples = await scrape(client)
    a = {"worker": "w-a", "model": "smollm2", "host": one_host(samples, "w-a")}
    assert value(samples, "llmfleet_worker_up", state="ready", **a) == 1
    assert value(samples, "llmfleet_num_requests_running", **a) == 3
    assert value(samples, "llmfleet_kv_cache_usage_ratio", **a) == 0.25
    assert value(samples, "llmfleet_prefix_cache_hits_total", **a) == 4
    assert value(samples, "llmfleet_num_preemptions_total", **a) == 2
    b = {"worker": "w-b", "model": "gemma3-270m", "host": one_host(samples, "w-b")}
    assert value(samples, "llmfleet_worker_generation_tokens_total", **b) == 512
    assert ("llmfleet_num_requests_waiting", (("model", "gemma3-270m"),)) in samples


def one_host(samples: dict, worker_id: str) -> str:
    """The host label a worker's llmfleet_worker_up sample carries."""
    hosts = [dict(labels)["host"] for (name, labels) in samples
             if name == "llmfleet_worker_up" and dict(labels)["worker"] == worker_id]
    assert len(hosts) == 1, hosts
    return hosts[0]


async def test_metrics_need_no_api_key(settings: Any, server: Any) -> None:
    import dataclasses

    import fakeredis

    from gateway.app import create_app

    app = create_app(dataclasses.replace(settings, api_key="secret"), redis=fakeredis.FakeAsyncRedis(server=server))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 401


async def test_model_jobs_counts_waiting_and_held_jobs_on_every_stream(client: httpx.AsyncClient, redis: Any,
                                                                       worker: Any) -> None:
    from shared import keys

    # a job placed on a worker's own stream (KEDA's redis-streams triggers cannot name it), and one held
    await redis.sadd(keys.placed_workers("smollm2"), "w-other")
    await redis.xadd(keys.worker_jobs_stream("smollm2", "w-other"), {keys.JOB_FIELD: b"placed"})
    task = asyncio.create_task(_chat(client))
    job = await worker.take()
    samples = await scrape(client)
    assert value(samples, "llmfleet_model_jobs", model="smollm2") == 2
    assert value(samples, "llmfleet_num_requests_waiting", model="smollm2") == 1
    await worker.token(job, "Hi")
    await worker.end(job)
    await worker.done(job)
    assert (await task).status_code == 200
