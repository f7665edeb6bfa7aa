"""`llmfleet serve` with two models at once: SmolLM2 (chat) beside Gemma 3 270M (a base model), driven by the
unmodified openai client. Gemma's greedy completions from the fixture's token ids follow llama.cpp's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.redis_server import free_port
from tests.support.processes import stop_serve

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MARGIN_FOR_ARGMAX = 0.05


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


def _agreed_prefix(case: dict) -> list[int]:
    """The fixture's greedy ids up to (not including) its first near-tie, where float rounding may pick either."""
    ids = []
    for step, token in enumerate(case["greedy_ids"]):
        top5 = case["top5_per_step"][step]
        if top5[0][1] - top5[1][1] <= MARGIN_FOR_ARGMAX:
            break
        ids.append(token)
    return ids


def test_both_models_are_listed(client: Any) -> None:
    assert {"smollm2-135m", "gemma3-270m"} <= {m.id for m in client.models.list().data}


def test_gemma_greedy_completions_from_token_ids_follow_llama_cpp(client: Any, gemma3_engine: Any,
                                                                   gemma3_reference: dict) -> None:
    """Every fixture prompt (the one longer than the 512 window too) through the cluster, greedy."""
    tokenizer = gemma3_engine.tokenizer
    checked = 0
    for case in gemma3_reference["greedy"]:
        expected = _agreed_prefix(case)
        reply = client.completions.create(model="gemma3-270m", prompt=case["prompt_ids"], temperature=0,
                                          max_tokens=len(case["greedy_ids"]))
        text = reply.choices[0].text
        assert text.startswith(tokenizer.decode(expected)), (case["prompt"][:40], text)
        checked += len(expected)
    assert checked >= 150  # 177 tokens of the 336 come before their prompt's first near-tie


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
