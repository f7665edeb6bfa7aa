"""Through the cluster: llama-server's tokenizer routes, usage's cached tokens and llama-server's `timings`."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"


def test_tokenizer_routes_answer_as_llama_server(cluster: Any, smollm2_reference: dict[str, Any]) -> None:
    http = httpx.Client(base_url=cluster.base_url, timeout=60)
    for case in smollm2_reference["tokenize"][:8]:
        got = http.post("/tokenize", json={"model": MODEL, "content": case["text"]}).json()
        assert got == {"tokens": case["ids_special"]}
        back = http.post("/detokenize", json={"model": MODEL, "tokens": case["ids"]}).json()
        assert back == {"content": case["text"]}
    pieces = http.post("/tokenize", json={"model": MODEL, "content": "Hello world", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": 19556, "piece": "Hello"}, {"id": 905, "piece": " world"}]}
    case = smollm2_reference["chat_template"][0]
    rendered = http.post("/apply-template", json={"model": MODEL, "messages": case["messages"]}).json()
    assert rendered == {"prompt": case["rendered"]}
    missing = http.post("/tokenize", json={"model": "no-such-model", "content": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_usage_counts_cached_prompt_tokens_and_timings_come_when_asked(cluster: Any) -> None:
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = "The history of the printing press in Europe begins " * 8  # several full KV blocks
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    assert first.model_extra is None or "timings" not in (first.model_extra or {})
    # two workers: by the third request, whichever worker takes it has seen the prompt before
    replies = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                         extra_body={"timings_per_token": True}) for _ in range(2)]
    assert all(r.choices[0].text == first.choices[0].text for r in replies)
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    second = max(replies, key=lambda r: r.usage.prompt_tokens_details.cached_tokens)  # type: ignore[union-attr]
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    timings = second.model_extra["timings"]  # type: ignore[index]
    # whole blocks from the pool or the host tier, and the prompt's last block from the tier's snapshot of its rows:
    # at most every token but the last, which always runs
    assert cached == timings["cache_n"] and 32 <= cached <= second.usage.prompt_tokens - 1
    assert timings["prompt_n"] + timings["cache_n"] == second.usage.prompt_tokens
    assert timings["predicted_n"] == 4 and timings["predicted_ms"] > 0 and timings["prompt_ms"] > 0
    assert timings["predicted_per_second"] > 0 and timings["queue_ms"] >= 0
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                            temperature=0, stream=True, extra_body={"timings_per_token": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].model_extra["timings"]["predicted_n"] == 3  # type: ignore[index]
