"""End to end with the unmodified `openai` client: a BERT embedding model served beside a chat model in one fleet."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from tests.support.batches import start_batch_runner
from tests.support.cluster import process_cluster_redis

pytestmark = [pytest.mark.slow, pytest.mark.integration]
EMBEDDER = "all-minilm-l6-v2"
CHAT_MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def fleet(minilm_f32_path: Path, smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Redis, a gateway, a MiniLM worker, a SmolLM2 worker and a batch runner as processes; yields the gateway's
    base URL."""
    cluster = process_cluster_redis(tmp_path_factory.mktemp("embedding-fleet-logs"), LLMFLEET_HOST="127.0.0.1",
                                    LLMFLEET_HEARTBEAT_INTERVAL_S="0.5", LLMFLEET_HEARTBEAT_TTL_S="5",
                                    LLMFLEET_KV_BUDGET_MIB="64", LLMFLEET_LOG_LEVEL="WARNING")
    try:
        cluster.start_gateway()
        cluster.start_worker(model=EMBEDDER)
        cluster.start_worker(model=CHAT_MODEL)
        start_batch_runner(cluster)
        cluster.wait_ready(2)
        yield cluster.base_url
    finally:
        cluster.close()


@pytest.fixture()
def client(fleet: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet + "/v1", api_key="unused", max_retries=0, timeout=120)


def cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two vectors."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embeddings_match_llama_cpp_through_the_sdk(client: openai.OpenAI, minilm_reference: dict[str, Any]) -> None:
    entries = [e for e in minilm_reference["texts"] if e["embedding_f32"] is not None]
    reply = client.embeddings.create(model=EMBEDDER, input=[e["text"] for e in entries])
    assert reply.model == EMBEDDER and len(reply.data) == len(entries)
    assert reply.usage.prompt_tokens == sum(e["n_tokens"] for e in entries)
    for item, entry in zip(reply.data, entries):
        assert abs(float(np.linalg.norm(item.embedding)) - 1.0) < 1e-4
        assert cosine(item.embedding, entry["embedding_f32"]) >= 0.9999, entry["text"][:60]


def test_chat_to_the_embedding_model_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "embedding model" in caught.value.body["message"] and caught.value.body["param"] == "model"


def test_an_input_over_the_context_is_a_400(client: openai.OpenAI, minilm_reference: dict[str, Any]) -> None:
    long = next(e for e in minilm_reference["texts"] if e["n_tokens"] > 512)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=EMBEDDER, input=["short", long["text"]])
    assert "567 tokens" in caught.value.body["message"]


def test_the_chat_model_still_chats_in_the_same_fleet(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
    assert reply.choices[0].message.content


def test_the_batch_api_embeds_with_it(client: openai.OpenAI, minilm_reference: dict[str, Any]) -> None:
    entry = minilm_reference["texts"][2]
    lines = [{"custom_id": "embed", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBEDDER, "input": [entry["text"]]}},
             {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file_id = client.files.create(file=("input.jsonl", data), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 300
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired"):
        assert time.monotonic() < deadline, batch.request_counts
        time.sleep(0.5)
    outputs = {}
    for file in (batch.output_file_id, batch.error_file_id):
        if file:
            outputs.update({item["custom_id"]: item for item in map(json.loads,
                                                                   client.files.content(file).text.splitlines())})
    vector = outputs["embed"]["response"]["body"]["data"][0]["embedding"]
    assert cosine(vector, entry["embedding_f32"]) >= 0.9999
    assert outputs["chat"]["response"]["status_code"] == 400
