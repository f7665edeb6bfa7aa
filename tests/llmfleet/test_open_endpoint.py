"""Safe by default, as a user starts it: `llmfleet gateway` and `llmfleet serve` on 0.0.0.0 with no API key
refuse to start and say why; with --allow-open (or LLMFLEET_ALLOW_OPEN=1) the gateway starts and warns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmfleet.redis_server import BundledRedis, free_port
from tests.support.processes import stop_all

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A real redis-server for the gateway that does start."""
    try:
        server = BundledRedis().start()
    except RuntimeError as exc:
        pytest.skip(f"no redis-server available: {exc}")
    yield server.url
    server.stop()


def _env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LLMFLEET_API_KEY", "LLMFLEET_KEYS_FILE", "LLMFLEET_ALLOW_OPEN", "LLMFLEET_PUBLISHED_HOST")}
    return {**env, "REDIS_URL": redis_url, **extra}


def _llmfleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmfleet.cli", *args]


@pytest.mark.parametrize("command", [["gateway"], ["serve", "--lazy"]])
def test_an_open_endpoint_by_accident_is_refused_with_the_reason(redis_url: str, command: list[str]) -> None:
    port = free_port()
    done = subprocess.run(_llmfleet(*command, "--host", "0.0.0.0", "--port", str(port)), env=_env(redis_url),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"refusing to serve 0.0.0.0:{port} with no API key" in done.stderr
    assert "LLMFLEET_API_KEY" in done.stderr and "LLMFLEET_ALLOW_OPEN=1" in done.stderr
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.parametrize(("flags", "extra"), [(["--allow-open"], {}), ([], {"LLMFLEET_ALLOW_OPEN": "1"}),
                                              ([], {"LLMFLEET_API_KEY": "a-long-random-key"})])
def test_the_opt_in_or_a_key_starts_it(redis_url: str, tmp_path: Path, flags: list[str],
                                       extra: dict[str, str]) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(_llmfleet("gateway", "--host", "0.0.0.0", "--port", str(port), *flags),
                                env=_env(redis_url, **extra), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.2)
        warned = "WARNING" in log.read_text() and "with no API key (LLMFLEET_ALLOW_OPEN=1)" in log.read_text()
        assert warned is ("LLMFLEET_API_KEY" not in extra)  # the opt-in warns; a key needs no warning
    finally:
        stop_all([proc])
