"""The official OpenAI Python SDK talks to the gateway unchanged."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def sdk(app_client) -> openai.AsyncOpenAI:
    """An AsyncOpenAI client wired to the app in process."""
    app, _ = app_client
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway/v1")
    return openai.AsyncOpenAI(api_key="unused", base_url="http://gateway/v1", http_client=http, max_retries=0)


async def test_chat_completion(sdk, worker) -> None:
    task = asyncio.create_task(sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4))
    job = await worker.take()
    await worker.answer(job, ["Hel", "lo"])
    completion = await task
    assert completion.choices[0].message.content == "Hello"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens == 5


async def test_chat_stream_with_usage(sdk, worker) -> None:
    async def consume() -> tuple[str, object]:
        """Read the stream with the SDK: the text and the usage."""
        stream = await sdk.chat.completions.create(
            model="smollm2", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            usage = chunk.usage or usage
        return text, usage

    task = asyncio.create_task(consume())
    job = await worker.take()
    await worker.answer(job, ["Hel", "lo"])
    text, usage = await task
    assert text == "Hello"
    assert usage is not None and usage.completion_tokens == 2  # type: ignore[attr-defined]


async def test_completion_and_embeddings(sdk, worker, make_worker) -> None:
    task = asyncio.create_task(sdk.completions.create(model="smollm2", prompt="Once", max_tokens=2))
    job = await worker.take()
    await worker.answer(job, [" upon", " a"])
    assert (await task).choices[0].text == " upon a"
    embedder = make_worker(model="embedder", worker_id="e1")
    await embedder.register()
    task = asyncio.create_task(sdk.embeddings.create(model="embedder", input="x"))
    job = await embedder.take()
    await embedder.done(job, prompt_tokens=1, completion_tokens=0, embeddings=[[0.25, 0.5]])
    result = await task
    assert result.data[0].embedding == [0.25, 0.5]  # the SDK asks for base64 and decodes it


async def test_models_and_errors(sdk, worker) -> None:
    models = await sdk.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.chat.completions.create(model="nope", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.chat.completions.create(model="smollm2", messages=MESSAGES, temperature=5)
    assert bad.value.param == "temperature"
