"""End to end with the unmodified `openai` client: a BERT embedding model served beside a chat model in one fleet
(tests/integration/conftest.py `embedding_fleet`, whose SmolLM2 workers opt in to causal embeddings)."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]
EMBEDDER = "all-minilm-l6-v2"
CHAT_MODEL = "smollm2-135m"


@pytest.fixture()
def client(embedding_fleet: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=embedding_fleet + "/v1", api_key="unused", max_retries=0, timeout=120)


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


def test_a_generative_model_embeds_when_its_workers_opt_in(client: openai.OpenAI) -> None:
    """LLMFLEET_CAUSAL_EMBEDDINGS=1: SmolLM2's pooled hidden states, unit length, as before the opt-in existed."""
    reply = client.embeddings.create(model=CHAT_MODEL, input=["hello world", "Redis is an in-memory store"])
    assert [d.index for d in reply.data] == [0, 1] and reply.usage.prompt_tokens > 0
    for item in reply.data:
        assert abs(math.sqrt(sum(x * x for x in item.embedding)) - 1.0) < 1e-3
    assert reply.data[0].embedding != reply.data[1].embedding


def test_the_batch_api_embeds_with_it(client: openai.OpenAI, minilm_reference: dict[str, Any]) -> None:
    entry = minilm_reference["texts"][2]
    pooled = {"model": CHAT_MODEL, "input": ["a batch of requests", "runs at low priority"]}
    lines = [{"custom_id": "embed", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBEDDER, "input": [entry["text"]]}},
             {"custom_id": "pooled", "method": "POST", "url": "/v1/embeddings", "body": pooled},
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
    direct = client.embeddings.create(**pooled)  # the opted-in chat model's line equals the same request made directly
    for got, want in zip(outputs["pooled"]["response"]["body"]["data"], direct.data, strict=True):
        assert max(abs(a - b) for a, b in zip(got["embedding"], want.embedding, strict=True)) < 1e-4
