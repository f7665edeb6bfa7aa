"""`llmfleet serve` with two models at once: SmolLM2 (chat) beside Gemma 3 270M (a base model), driven by the
unmodified openai client. Gemma's greedy completions from the fixture's token ids are the engine's own, byte for
byte (how close the engine's quantized arithmetic is to llama.cpp's: tests/worker/engine/test_quantized_accuracy.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from llmfleet.redis_server import free_port
from tests.support.processes import stop_serve
from worker.engine.forward_batch import BatchEntry

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _ready(base_url: str) -> dict[str, Any]:
    """The gateway's /ready body ({} while it does not answer)."""
    try:
        return httpx.get(base_url + "/ready", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {}


@pytest.fixture(scope="module")
def two_model_serve(smollm2_gguf_path: Path, gemma3_gguf_path: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`llmfleet serve --model smollm2-135m --model gemma3-270m`; its base URL; stopped with SIGINT afterwards."""
    port = free_port()
    env = {**os.environ, "LLMFLEET_SLOTS": "4", "LLMFLEET_KV_BUDGET_MIB": "96", "LLMFLEET_REGISTRY_CACHE_S": "0",
           "LLMFLEET_LOG_LEVEL": "INFO"}
    env.pop("REDIS_URL", None)
    log = tmp_path_factory.mktemp("serve-models") / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmfleet.cli", "serve", "--port", str(port), "--model", "smollm2-135m",
             "--model", "gemma3-270m"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while _ready(base_url).get("workers") != 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _ready(base_url).get("workers") == 2, log.read_text()[-3000:]
        yield base_url
    finally:
        stop_serve(process)


@pytest.fixture()
def client(two_model_serve: str) -> Any:
    """The unmodified openai client pointed at the serve."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=two_model_serve + "/v1", api_key="unused", max_retries=0, timeout=600)


def _engine_greedy(engine: Any, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The engine's own greedy tokens for a prompt, computed in this process, the prompt in one forward (up to an
    end-of-generation token)."""
    model = engine.model
    pool = model.new_pool(64 << 20, enable_prefix_caching=False)
    pool.ensure(0, len(prompt_ids))
    logits = model.forward([BatchEntry(0, np.array(prompt_ids), 0)], pool)[0]  # (V,)
    ids: list[int] = []
    while len(ids) < max_tokens:
        token = int(np.argmax(logits))
        if token in engine.tokenizer.eog_token_ids:
            break
        ids.append(token)
        start = pool.blocks.num_tokens(0)
        pool.extend(0, 1)
        logits = model.forward([BatchEntry(0, np.array([token]), start)], pool)[0]  # (V,)
    return ids


def test_both_models_are_listed(client: Any) -> None:
    assert {"smollm2-135m", "gemma3-270m"} <= {m.id for m in client.models.list().data}


def test_gemma_greedy_completions_from_token_ids_are_the_engines_own(client: Any, gemma3_engine: Any,
                                                                      gemma3_reference: dict) -> None:
    """Every fixture prompt (the one longer than the 512 window too, prefilled in chunks by the server) through the
    cluster, greedy: the text the engine computes alone in this process, exactly (batch-invariant kernels)."""
    tokenizer = gemma3_engine.tokenizer
    checked = 0
    for case in gemma3_reference["greedy"]:
        reply = client.completions.create(model="gemma3-270m", prompt=case["prompt_ids"], temperature=0,
                                          max_tokens=len(case["greedy_ids"]))
        expected = _engine_greedy(gemma3_engine, case["prompt_ids"], len(case["greedy_ids"]))
        assert reply.choices[0].text == tokenizer.decode(expected), case["prompt"][:40]
        checked += len(expected)
    assert checked >= 300  # 336 steps in the fixture's prompts


def test_gemma_chat_is_a_clear_400_smollm2_chat_still_works(client: Any) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gemma3-270m", messages=[{"role": "user", "content": "hi"}])
    error = caught.value.body
    assert error["code"] == "no_chat_template" and error["param"] == "messages"
    assert "chat template" in error["message"] and "--chat-template" in error["message"]
    reply = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)
    assert reply.choices[0].message.content
