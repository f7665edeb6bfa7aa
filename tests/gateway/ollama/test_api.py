"""Ollama's API through the unmodified ollama client against the gateway and a scripted worker (FakeRedis): the
jobs each route makes, reply and stream shapes, final-object counts, tool calls, embeddings, model routes and
Ollama-shaped errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx
import pytest

from shared import keys
from shared.errors import ContextLengthExceeded
from shared.messages import ChoiceEndEvent, DoneEvent, ErrorEvent, Timing, Usage
from shared.settings import Settings

ollama = pytest.importorskip("ollama")
pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = ['<tool_call>\n{"name": "get_', 'weather", "arguments": {"ci', 'ty": "Pa}ris"}}\n</tool_call>']
TIMING = Timing(queue_s=0.25, first_token_s=0.5, total_s=2.0)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The gateway tests' settings, with time for a scripted worker's first event before a stream opens (a slow
    machine must not turn an early error into a stream's last line)."""
    return dataclasses.replace(settings, sse_queued_after_s=5.0)


@pytest.fixture
def sdk(app_client: tuple[Any, httpx.AsyncClient]) -> Any:
    app, _ = app_client
    return ollama.AsyncClient(host="http://gateway", transport=httpx.ASGITransport(app=app))


async def _finish(worker: Any, job: Any, texts: list[str], reason: str = "stop", **done: Any) -> None:
    for text in texts:
        await worker.token(job, text)
    await worker.send(ChoiceEndEvent(id=job.id, seq=worker.next_seq(job.id), finish_reason=reason))
    await worker.done(job, prompt_tokens=7, completion_tokens=len(texts), **done)


async def test_chat_maps_options_onto_the_job_and_answers_in_ollamas_shape(sdk, worker) -> None:
    options = {"temperature": 0.2, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "num_predict": 12, "stop": ["END"],
               "seed": 42, "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    task = asyncio.create_task(sdk.chat(model="smollm2:latest", messages=ASK, stream=False, options=options))
    job = await worker.take()
    sampling = job.sampling
    assert (job.model, job.max_tokens, job.stop, job.stream) == ("smollm2", 12, ["END"], False)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.seed) == (0.2, 0.5, 7, 0.1, 42)
    assert (sampling.repetition_penalty, sampling.presence_penalty, sampling.frequency_penalty) == (1.2, 0.5, 0.25)
    assert job.messages[0].content == "Weather in Paris?"
    await _finish(worker, job, ["Sunny", ", 21 C."], timing=TIMING)
    reply = await task
    assert reply.model == "smollm2:latest" and reply.message.role == "assistant"
    assert reply.message.content == "Sunny, 21 C." and reply.done and reply.done_reason == "stop"
    assert (reply.prompt_eval_count, reply.eval_count) == (7, 2)
    assert (reply.load_duration, reply.prompt_eval_duration, reply.eval_duration) == (250_000_000, 250_000_000,
                                                                                       1_500_000_000)
    assert reply.total_duration > 0


async def test_ollamas_defaults_fill_what_the_options_leave_out(sdk, worker) -> None:
    task = asyncio.create_task(sdk.chat(model="smollm2", messages=ASK, stream=False))
    job = await worker.take()
    assert (job.sampling.temperature, job.sampling.top_k, job.sampling.top_p) == (0.8, 40, 0.9)
    assert job.max_tokens is None and job.sampling.repetition_penalty == 1.0
    await _finish(worker, job, ["ok"], reason="length")
    assert (await task).done_reason == "length"


async def test_a_chat_streams_by_default_one_object_per_line(client, worker) -> None:
    async def run() -> httpx.Response:
        return await client.post("/api/chat", json={"model": "smollm2", "messages": ASK})

    task = asyncio.create_task(run())
    job = await worker.take()
    assert job.stream
    await _finish(worker, job, ["Sun", "ny"], timing=TIMING)
    response = await task
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["message"]["content"] for line in lines] == ["Sun", "ny", ""]
    assert [line["done"] for line in lines] == [False, False, True]
    last = lines[-1]
    assert last["done_reason"] == "stop" and last["eval_count"] == 2 and last["prompt_eval_count"] == 7
    assert last["eval_duration"] == 1_500_000_000 and all(line["model"] == "smollm2" for line in lines)


async def test_generate_streams_through_the_sdk_and_renders_system_and_prompt(sdk, worker) -> None:
    async def run() -> list[Any]:
        return [part async for part in await sdk.generate(model="smollm2", prompt="Hi", system="Be brief",
                                                           stream=True)]

    task = asyncio.create_task(run())
    job = await worker.take()
    assert [(m.role, m.content) for m in job.messages] == [("system", "Be brief"), ("user", "Hi")]
    await _finish(worker, job, ["Hel", "lo"])
    parts = await task
    assert "".join(p.response for p in parts) == "Hello" and parts[-1].done and not parts[0].done


async def test_raw_generate_is_a_prompt_job_with_no_template(sdk, worker) -> None:
    task = asyncio.create_task(sdk.generate(model="smollm2", prompt="1, 2, 3,", raw=True, stream=False))
    job = await worker.take()
    assert job.prompt == "1, 2, 3," and job.messages is None and job.max_tokens is None
    await _finish(worker, job, [" 4"])
    assert (await task).response == " 4"


async def test_tool_calls_come_whole_with_arguments_as_objects(sdk, worker) -> None:
    task = asyncio.create_task(sdk.chat(model="smollm2", messages=ASK, tools=[WEATHER], stream=False))
    job = await worker.take()
    assert [t.name for t in job.tools] == ["get_weather"] and job.tool_choice == "auto"
    await _finish(worker, job, CALL)
    reply = await task
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Pa}ris"}
    assert reply.message.content == "" and reply.done_reason == "stop"


async def test_a_streamed_tool_call_is_one_object_and_a_cut_short_one_is_dropped(client, worker) -> None:
    task = asyncio.create_task(client.post("/api/chat", json={"model": "smollm2", "messages": ASK,
                                                              "tools": [WEATHER]}))
    job = await worker.take()
    await _finish(worker, job, [*CALL, '<tool_call>\n{"name": "get_weather", "arguments": {"ci'], reason="length")
    lines = [json.loads(line) for line in (await task).text.splitlines()]
    calls = [line["message"]["tool_calls"] for line in lines if "tool_calls" in line["message"]]
    assert calls == [[{"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Pa}ris"}}}]]
    assert all(line["message"]["content"] == "" for line in lines)
    # issue 42: the complete call is a finished tool turn ("stop"); the dropped one is counted
    assert lines[-1]["done_reason"] == "stop" and lines[-1]["dropped_tool_calls"] == 1
    task = asyncio.create_task(client.post("/api/chat", json={"model": "smollm2", "messages": ASK, "stream": False,
                                                              "tools": [WEATHER]}))
    await _finish(worker, await worker.take(), ['<tool_call>\n{"name": "get_weather", "arguments": {"ci'],
                  reason="length")  # nothing complete: cut short
    response = await task
    assert response.json()["done_reason"] == "length" and "tool_calls" not in response.json()["message"]
    assert response.headers["x-llmfleet-dropped-tool-calls"] == "1"


THINKING = ["<think>", "\nIt is", " sunny.\n</th", "ink>\n\n", "Sunny", "."]


async def test_a_thinking_block_is_ollamas_thinking_collected_streamed_and_kept_with_think_false(sdk, client,
                                                                                                 worker) -> None:
    task = asyncio.create_task(sdk.chat(model="smollm2", messages=ASK, think=True, stream=False))
    await _finish(worker, await worker.take(), THINKING)
    reply = await task
    assert (reply.message.thinking, reply.message.content) == ("It is sunny.", "Sunny.")
    task = asyncio.create_task(client.post("/api/chat", json={"model": "smollm2", "messages": ASK, "think": True}))
    await _finish(worker, await worker.take(), THINKING)
    lines = [json.loads(line)["message"] for line in (await task).text.splitlines()]
    assert "".join(m.get("thinking", "") for m in lines) == "It is sunny."
    assert "".join(m["content"] for m in lines) == "Sunny."
    assert not any(m["content"] for m in lines if m.get("thinking"))  # thinking objects carry no content
    task = asyncio.create_task(sdk.generate(model="smollm2", prompt="Weather?", think=True, stream=False))
    await _finish(worker, await worker.take(), THINKING)
    generated = await task
    assert (generated.thinking, generated.response) == ("It is sunny.", "Sunny.")
    task = asyncio.create_task(sdk.chat(model="smollm2", messages=ASK, think=False, stream=False))
    await _finish(worker, await worker.take(), THINKING)
    kept = await task
    assert kept.message.content == "".join(THINKING) and not kept.message.thinking


async def test_history_tool_calls_and_results_become_chat_turns(sdk, worker) -> None:
    messages = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "21 C", "tool_name": "get_weather"}]
    task = asyncio.create_task(sdk.chat(model="smollm2", messages=messages, tools=[WEATHER], stream=False))
    job = await worker.take()
    call = job.messages[1].tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert job.messages[2].role == "tool" and job.messages[2].tool_call_id == call.id
    await _finish(worker, job, ["It is 21 C."])
    assert (await task).message.content == "It is 21 C."


@pytest.mark.parametrize(("given", "param"), [("json", "response_format"),
                                              ({"type": "object", "properties": {"a": {"type": "integer"}}},
                                               "response_format.json_schema.schema")])
async def test_format_is_the_structured_output_constraint(sdk, worker, given: Any, param: str) -> None:
    task = asyncio.create_task(sdk.generate(model="smollm2", prompt="JSON please", format=given, stream=False))
    job = await worker.take()
    assert job.constraint is not None and job.constraint.kind == "json_schema" and job.constraint.param == param
    schema = json.loads(job.constraint.source)
    assert schema == ({"type": "object"} if given == "json" else given)
    await _finish(worker, job, ['{"a": 1}'])
    assert json.loads((await task).response) == {"a": 1}


async def test_a_schema_the_worker_refuses_is_a_400_naming_format(client, worker) -> None:
    task = asyncio.create_task(client.post("/api/chat", json={"model": "smollm2", "messages": ASK,
                                                              "format": {"type": 5}}))
    job = await worker.take()
    await worker.send(ErrorEvent(id=job.id, seq=worker.next_seq(job.id), status=400, type="invalid_request_error",
                                 code="invalid_value", param=job.constraint.param,
                                 message=f"Invalid value for '{job.constraint.param}': not a schema."))
    response = await task
    assert response.status_code == 400 and response.json() == {"error": "Invalid value for 'format': not a schema."}


@pytest.mark.parametrize(("body", "needle"), [
    ({"options": {"temperature": "hot"}}, "options.temperature"),
    ({"options": {"num_predict": 1.5}}, "options.num_predict"),
    ({"options": {"stop": "x", "top_k": [1]}}, "options.top_k"),
    ({"options": {"use_mmap": 1}}, "options.use_mmap"),
    ({"options": "fast"}, "'options'"),
    ({"options": {"temperature": 9}}, "options.temperature"),
    ({"format": "xml"}, "'format'"),
    ({"format": ["json"]}, "'format'"),
    ({"stream": "yes"}, "'stream'"),
    ({"think": "hard"}, "'think'"),
    ({"keep_alive": "soon"}, "'keep_alive'"),
    ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "images"),
])
async def test_bad_input_is_a_400_in_ollamas_shape_and_queues_nothing(client, worker, redis, body, needle) -> None:
    response = await client.post("/api/chat", json={"model": "smollm2", "messages": ASK, **body})
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"] and needle in response.json()["error"]
    assert not any([await redis.exists(stream) for stream in keys.jobs_streams("smollm2")])


async def test_the_sdk_raises_ollamas_response_error(sdk, worker) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        await sdk.chat(model="smollm2", messages=ASK, options={"temperature": "hot"}, stream=False)
    assert caught.value.status_code == 400 and "options.temperature" in caught.value.error
    with pytest.raises(ollama.ResponseError) as missing:
        await sdk.chat(model="nope", messages=ASK, stream=False)
    assert missing.value.status_code == 404


async def test_num_ctx_is_checked_against_the_context_the_worker_publishes(client, worker) -> None:
    await worker.register(**{"stat.context_length": 2048})
    too_big = await client.post("/api/generate", json={"model": "smollm2", "prompt": "hi",
                                                       "options": {"num_ctx": 4096}})
    assert too_big.status_code == 400 and "2048" in too_big.json()["error"]
    task = asyncio.create_task(client.post("/api/generate", json={"model": "smollm2", "prompt": "hi", "stream": False,
                                                                  "options": {"num_ctx": 2048}}))
    job = await worker.take()
    await _finish(worker, job, ["ok"])
    assert (await task).json()["response"] == "ok"


async def test_an_early_worker_error_is_a_plain_error_and_a_late_one_the_last_line(client, worker) -> None:
    task = asyncio.create_task(client.post("/api/chat", json={"model": "smollm2", "messages": ASK}))
    job = await worker.take()
    await worker.send(ContextLengthExceeded("too long").to_event(job.id, worker.next_seq(job.id)))
    early = await task
    assert early.status_code == 400 and early.json() == {"error": "too long"}

    task = asyncio.create_task(client.post("/api/chat", json={"model": "smollm2", "messages": ASK}))
    job = await worker.take()
    await worker.token(job, "Sun")
    await asyncio.sleep(0.05)
    await worker.send(ErrorEvent(id=job.id, seq=worker.next_seq(job.id), status=500, type="server_error",
                                 code="worker_error", message="the worker broke"))
    late = await task
    lines = [json.loads(line) for line in late.text.splitlines()]
    assert late.status_code == 200 and lines[0]["message"]["content"] == "Sun"
    assert lines[-1] == {"error": "the worker broke"}


async def test_embed_and_the_older_embeddings_route(sdk, worker) -> None:
    task = asyncio.create_task(sdk.embed(model="smollm2", input=["a", "b"]))
    job = await worker.take()
    assert job.inputs == ["a", "b"] and job.normalize
    await worker.send(DoneEvent(id=job.id, seq=worker.next_seq(job.id), embeddings=[[0.6, 0.8], [1.0, 0.0]],
                                usage=Usage(prompt_tokens=2, completion_tokens=0, total_tokens=2)))
    reply = await task
    assert [list(v) for v in reply.embeddings] == [[0.6, 0.8], [1.0, 0.0]] and reply.prompt_eval_count == 2

    task = asyncio.create_task(sdk.embeddings(model="smollm2", prompt="a"))
    job = await worker.take()
    assert job.inputs == ["a"] and not job.normalize
    await worker.send(DoneEvent(id=job.id, seq=worker.next_seq(job.id), embeddings=[[3.0, 4.0]],
                                usage=Usage(prompt_tokens=1, completion_tokens=0, total_tokens=1)))
    assert list((await task).embedding) == [3.0, 4.0]


async def test_model_routes(sdk, client, worker) -> None:
    await worker.register(**{"stat.context_length": 8192})
    listed = await sdk.list()
    assert [m.model for m in listed.models] == ["smollm2"] and listed.models[0].details.format == "gguf"
    shown = await sdk.show("smollm2:latest")
    assert shown.modelinfo["llmfleet.context_length"] == 8192 and "completion" in shown.capabilities
    assert listed.models[0].size == 0 and listed.models[0].details.family == ""  # no facts published yet
    running = await sdk.ps()
    assert [(m.model, m.context_length) for m in running.models] == [("smollm2", 8192)]
    assert running.models[0].expires_at.year == 2318  # a worker no node agent manages is never unloaded
    assert (await client.get("/api/version")).json()["version"]
    assert (await client.get("/")).text == "Ollama is running"
    with pytest.raises(ollama.ResponseError) as missing:
        await sdk.show("nope")
    assert missing.value.status_code == 404 and missing.value.error == "model 'nope' not found"


async def test_the_model_files_published_facts(sdk, worker, redis) -> None:
    """What a worker read of its GGUF (worker/model_facts.py) is what /api/tags, /api/show and /api/ps say."""
    await worker.register(**{"stat.context_length": 4096})
    facts = {"size": 145_000_000, "digest": "ab" * 32, "family": "llama", "parameter_size": "134.52M",
             "quantization_level": "Q8_0", "format": "gguf",
             "model_info": {"general.architecture": "llama", "general.parameter_count": 134_515_008,
                            "llama.context_length": 8192, "llama.block_count": 30}}
    await redis.hset(keys.MODEL_FACTS, "smollm2", json.dumps(facts))
    (listed,) = (await sdk.list()).models
    assert (listed.size, listed.digest) == (145_000_000, "ab" * 32)
    assert (listed.details.family, listed.details.parameter_size, listed.details.quantization_level) == (
        "llama", "134.52M", "Q8_0") and listed.details.families == ["llama"]
    shown = await sdk.show("smollm2")
    assert shown.details.quantization_level == "Q8_0" and shown.modelinfo["general.parameter_count"] == 134_515_008
    assert shown.modelinfo["llama.context_length"] == 4096 and shown.modelinfo["llama.block_count"] == 30
    (running,) = (await sdk.ps()).models
    assert running.digest == "ab" * 32 and running.details.family == "llama"
    await redis.hset(keys.MODEL_FACTS, "smollm2", "not json")
    assert (await sdk.list()).models[0].size == 0  # unreadable: as if not published


async def test_an_empty_chat_loads_and_keep_alive_zero_unloads(sdk, worker) -> None:
    loaded = await sdk.chat(model="smollm2", messages=[], stream=False)
    assert loaded.done and loaded.done_reason == "load"
    unloaded = await sdk.generate(model="smollm2", prompt="", keep_alive=0, stream=False)
    assert unloaded.done_reason == "unload"


async def test_unknown_api_paths_answer_in_ollamas_shape(client) -> None:
    response = await client.post("/api/pull", json={"model": "x"})
    assert response.status_code == 404 and list(response.json()) == ["error"]


async def test_a_queued_stream_opens_at_once_with_empty_objects_as_keep_alives(sdk, worker, settings) -> None:
    object.__setattr__(settings, "sse_queued_after_s", 0.0)  # frozen; tests may bend it
    object.__setattr__(settings, "sse_keepalive_s", 0.05)

    async def run() -> list[Any]:
        return [part async for part in await sdk.chat(model="smollm2", messages=ASK, stream=True)]

    task = asyncio.create_task(run())
    job = await worker.take()
    await asyncio.sleep(0.3)  # queued: keep-alives go out meanwhile
    await _finish(worker, job, ["Sun", "ny"])
    parts = await task
    assert len(parts) > 4 and all(p.message.content == "" for p in parts[:-3])
    assert "".join(p.message.content for p in parts) == "Sunny" and parts[-1].done
