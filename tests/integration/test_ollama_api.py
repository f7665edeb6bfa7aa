"""Ollama's API end to end with the unmodified ollama client: gateway -> Redis -> SmolLM2 workers. Greedy replies
are compared with the same request through the openai client, which makes the same jobs."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

ollama = pytest.importorskip("ollama")
pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
EMBEDDER = "all-minilm-l6-v2"
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
GREEDY = {"temperature": 0, "num_predict": 24}
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                         "country": {"type": "string", "maxLength": 30},
                                         "kind": {"enum": ["capital", "other"]}},
        "required": ["name", "country", "kind"], "additionalProperties": False}
# as the ollama client sends it: its Tool model keeps only these keys (no maxLength, no additionalProperties), in
# this order, so the OpenAI twin gets the same tool and the same prompt
PARAMETERS = {"type": "object", "required": ["city", "unit"],
              "properties": {"city": {"type": "string", "description": "A city"},
                             "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": PARAMETERS}}


@pytest.fixture()
def client(cluster: Any) -> Any:
    return ollama.Client(host=cluster.base_url, timeout=120)


@pytest.fixture()
def openai_client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _final_fields_are_sane(reply: Any) -> None:
    assert reply.done and reply.done_reason in ("stop", "length")
    assert reply.prompt_eval_count > 0 and reply.eval_count > 0
    assert reply.total_duration >= reply.prompt_eval_duration + reply.eval_duration > 0
    assert reply.load_duration >= 0


def test_a_greedy_chat_equals_the_same_chat_through_openai(client: Any, openai_client: openai.OpenAI) -> None:
    reply = client.chat(model=MODEL, messages=ASK, stream=False, options=GREEDY)
    twin = openai_client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0)
    assert reply.message.role == "assistant" and reply.message.content == twin.choices[0].message.content
    assert reply.done_reason == twin.choices[0].finish_reason and reply.model == MODEL
    assert (reply.prompt_eval_count, reply.eval_count) == (twin.usage.prompt_tokens, twin.usage.completion_tokens)
    _final_fields_are_sane(reply)


def test_a_streamed_chat_adds_up_to_the_whole_one(client: Any) -> None:
    whole = client.chat(model=f"{MODEL}:latest", messages=ASK, stream=False, options=GREEDY)
    parts = list(client.chat(model=f"{MODEL}:latest", messages=ASK, stream=True, options=GREEDY))
    assert len(parts) > 3 and not any(p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert (parts[-1].eval_count, parts[-1].done_reason) == (whole.eval_count, whole.done_reason)
    _final_fields_are_sane(parts[-1])


def test_generate_streams_and_not(client: Any, openai_client: openai.OpenAI) -> None:
    whole = client.generate(model=MODEL, prompt="Name three colours of the rainbow.", stream=False, options=GREEDY)
    parts = list(client.generate(model=MODEL, prompt="Name three colours of the rainbow.", stream=True,
                                 options=GREEDY))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    chat = client.chat(model=MODEL, messages=ASK, stream=False, options=GREEDY)
    assert whole.response == chat.message.content  # a prompt is one user turn
    _final_fields_are_sane(whole)
    raw = client.generate(model=MODEL, prompt="1, 2, 3, 4,", raw=True, stream=False, options=GREEDY)
    twin = openai_client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=24, temperature=0)
    assert raw.response == twin.choices[0].text and raw.prompt_eval_count == twin.usage.prompt_tokens


def test_embed_matches_v1_embeddings_and_the_older_route_is_unnormalized(embedding_fleet: str) -> None:
    """/api/embed and /api/embeddings on the real embedding model (all-MiniLM-L6-v2, tests/integration/conftest.py)."""
    client = ollama.Client(host=embedding_fleet, timeout=120)
    openai_client = openai.OpenAI(base_url=embedding_fleet + "/v1", api_key="unused", max_retries=0, timeout=120)
    texts = ["The cat sat on the mat.", "Quantum chromodynamics"]
    reply = client.embed(model=EMBEDDER, input=texts)
    twin = openai_client.embeddings.create(model=EMBEDDER, input=texts)
    assert len(reply.embeddings) == 2 and reply.prompt_eval_count == twin.usage.prompt_tokens
    for got, want in zip(reply.embeddings, twin.data, strict=True):
        assert max(abs(a - b) for a, b in zip(got, want.embedding, strict=True)) < 1e-6
        assert math.isclose(math.hypot(*got), 1.0, rel_tol=1e-4)
    legacy = client.embeddings(model=EMBEDDER, prompt=texts[0]).embedding
    norm = math.hypot(*legacy)
    assert norm > 0 and not math.isclose(norm, 1.0, rel_tol=1e-3)
    assert max(abs(a / norm - b) for a, b in zip(legacy, reply.embeddings[0], strict=True)) < 1e-4


def test_embed_on_a_generative_model_is_a_400_in_ollamas_shape(client: Any, cluster: Any) -> None:
    """SmolLM2 without LLMFLEET_CAUSAL_EMBEDDINGS refuses both embedding routes; the reason names the model."""
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model=MODEL, input=["The cat sat on the mat."])
    assert caught.value.status_code == 400
    assert f"'{MODEL}' is a generative model" in caught.value.error and "LLMFLEET_CAUSAL_EMBEDDINGS" in caught.value.error
    with pytest.raises(ollama.ResponseError) as older:
        client.embeddings(model=MODEL, prompt="The cat sat on the mat.")
    assert older.value.status_code == 400 and older.value.error == caught.value.error
    raw = httpx.post(cluster.base_url + "/api/embed", json={"model": MODEL, "input": "x"}, timeout=60)
    assert raw.status_code == 400 and raw.json() == {"error": caught.value.error}


def test_list_show_and_ps(client: Any, smollm2_gguf_path: Path) -> None:
    """The size, digest and details are the GGUF file's, as the workers read and publish them."""
    deadline = time.monotonic() + 60
    while (listed := next(m for m in client.list().models if m.model == MODEL)).size == 0:
        assert time.monotonic() < deadline, "the workers never published the model file's facts"
        time.sleep(0.5)  # a worker is still hashing the file (once: the digest is cached beside it)
    assert listed.size == smollm2_gguf_path.stat().st_size
    assert listed.digest == hashlib.sha256(smollm2_gguf_path.read_bytes()).hexdigest()
    assert (listed.details.format, listed.details.family, listed.details.quantization_level) == ("gguf", "llama",
                                                                                                   "Q4_1")
    assert listed.details.parameter_size.endswith("M")
    shown = client.show(MODEL)
    context = shown.modelinfo["llama.context_length"]
    assert context >= 2048 and "completion" in shown.capabilities and shown.details == listed.details
    (running,) = [m for m in client.ps().models if m.model == MODEL]
    assert running.context_length == context and running.digest == listed.digest


def test_format_with_a_schema_gives_json_that_validates(client: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    ask = [{"role": "user", "content": "Describe Paris as JSON."}]
    options = {"temperature": 0, "num_predict": 120}
    reply = client.chat(model=MODEL, messages=ask, format=CITY, stream=False, options=options)
    assert reply.done_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content), CITY)
    parts = list(client.generate(model=MODEL, prompt="Describe Paris as JSON.", format=CITY, stream=True,
                                 options=options))
    jsonschema.validate(json.loads("".join(p.response for p in parts)), CITY)
    free = client.generate(model=MODEL, prompt="A JSON object about cats.", format="json", stream=False,
                           options={"temperature": 0, "num_predict": 16})
    assert free.response.startswith("{")  # SmolLM2 writes a long object; 16 tokens hold its start only


def test_tools_reach_the_model_and_a_tool_round_trip_equals_openais(client: Any,
                                                                    openai_client: openai.OpenAI) -> None:
    # SmolLM2-135M answers this in text under "auto" (Ollama has no tool_choice to force a call); the calls'
    # Ollama shape is checked with the same client against a scripted worker (tests/gateway/ollama)
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    options = {"temperature": 0, "num_predict": 40}
    plain = client.chat(model=MODEL, messages=ask, stream=False, options=options)
    reply = client.chat(model=MODEL, messages=ask, tools=[WEATHER], stream=False, options=options)
    completion = openai_client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], max_tokens=40,
                                                       temperature=0)
    twin, twin_usage = completion.choices[0], completion.usage
    assert reply.prompt_eval_count > plain.prompt_eval_count  # the tools are in the prompt
    assert reply.prompt_eval_count == twin_usage.prompt_tokens  # the same prompt as through openai
    want = [(c.function.name, json.loads(c.function.arguments)) for c in twin.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in reply.message.tool_calls or []] == want
    assert reply.message.content == (twin.message.content or "")
    arguments = {"city": "Paris", "unit": "celsius"}
    history = [*ask, {"role": "assistant", "content": "",
                      "tool_calls": [{"function": {"name": "get_weather", "arguments": arguments}}]},
               {"role": "tool", "tool_name": "get_weather", "content": "21 C and sunny"}]
    answer = client.chat(model=MODEL, messages=history, tools=[WEATHER], stream=False, options=options)
    openai_history = [*ask, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C and sunny"}]
    twin_answer = openai_client.chat.completions.create(model=MODEL, messages=openai_history, tools=[WEATHER],
                                                        max_tokens=40, temperature=0).choices[0]
    assert answer.message.content == twin_answer.message.content and answer.message.content


@pytest.mark.parametrize(("kwargs", "status"), [
    ({"options": {"temperature": "hot"}}, 400), ({"options": {"num_ctx": 10 ** 7}}, 400),
    ({"format": {"type": "object", "properties": 5}}, 400), ({"model": "nope"}, 404)])
def test_bad_input_is_refused_in_ollamas_shape(client: Any, kwargs: dict[str, Any], status: int) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(**{"model": MODEL, "messages": ASK, "stream": False, **kwargs})
    assert caught.value.status_code == status and caught.value.error


def test_a_format_that_is_not_a_schema_is_a_400(cluster: Any) -> None:
    import httpx  # the ollama client itself refuses to send such a format

    response = httpx.post(cluster.base_url + "/api/generate", timeout=30,
                          json={"model": MODEL, "prompt": "hi", "format": "xml"})
    assert response.status_code == 400 and list(response.json()) == ["error"] and "format" in response.json()["error"]


def test_pull_of_a_known_model_streams_progress_and_an_unknown_one_lists_the_known(client: Any,
                                                                                    smollm2_gguf_path: Path) -> None:
    """Issue 42 (Open WebUI's pull button): the gateway runs `llmfleet pull`'s code on the cache SmolLM2 is in."""
    updates = list(client.pull("smollm2:latest", stream=True))
    assert updates[0].status == "pulling manifest" and updates[-1].status == "success"
    (layer,) = [u for u in updates if u.total is not None]
    assert layer.total == layer.completed == smollm2_gguf_path.stat().st_size
    assert layer.digest == "sha256:" + hashlib.sha256(smollm2_gguf_path.read_bytes()).hexdigest()
    assert client.pull(MODEL, stream=False).status == "success"
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("llama3.2:1b")
    assert caught.value.status_code == 404 and MODEL in caught.value.error and EMBEDDER in caught.value.error
