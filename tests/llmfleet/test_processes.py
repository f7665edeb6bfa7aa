"""llmfleet.processes helpers: the configured chat template is read once, with clear errors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmfleet.processes import _node, read_chat_template, serve, settings_env
from shared.redis_sockets import COMMAND_TIMEOUT_S
from shared.settings import Settings, SettingsError


def test_no_template_configured_is_none() -> None:
    assert read_chat_template(None) is None and read_chat_template("") is None


def test_a_template_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text("{{ messages[0].content }}", encoding="utf-8")
    assert read_chat_template(str(path)) == "{{ messages[0].content }}"


@pytest.mark.parametrize("content", [None, "  \n"])
def test_missing_or_empty_template_is_a_settings_error(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "chat.jinja"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError, match="LLMFLEET_CHAT_TEMPLATE: .*chat.jinja"):
        read_chat_template(str(path))


def test_serve_passes_the_template_to_its_workers(tmp_path: Path) -> None:
    env = settings_env(Settings(chat_template=str(tmp_path / "t.jinja")))
    assert Settings.from_env(env).chat_template == str(tmp_path / "t.jinja")


@pytest.mark.integration
def test_healthcheck_sees_a_running_batch_runner_and_not_a_stopped_one(redis_server: object) -> None:
    import os
    import subprocess
    import sys
    import time

    from llmfleet.processes import healthcheck

    settings = Settings(redis_url=redis_server.url)  # type: ignore[attr-defined]
    assert healthcheck("batch-runner", settings) == 1
    env = {**os.environ, "REDIS_URL": settings.redis_url, "LLMFLEET_LOG_LEVEL": "WARNING"}
    runner = subprocess.Popen([sys.executable, "-m", "llmfleet.cli", "batch-runner"], env=env)
    try:
        deadline = time.monotonic() + 30
        while healthcheck("batch-runner", settings) != 0:
            assert time.monotonic() < deadline and runner.poll() is None, "the batch runner never registered"
            time.sleep(0.2)
    finally:
        runner.terminate()
        assert runner.wait(timeout=30) == 0
    assert healthcheck("batch-runner", settings) == 1  # it deregistered on SIGTERM


def test_the_node_agents_command_on_a_held_connection_fails_within_the_timeout(proxied_redis: Any) -> None:
    _url, proxy = proxied_redis
    node = _node(Settings(redis_url=f"redis://127.0.0.1:{proxy.port}/0"), {}, {}, pinned={}, max_loaded=1)
    node.redis.set("k", b"v")
    proxy.hold_open()  # a partition that lost the open connection's packets
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError):
        node.redis.get("k")  # a pool turn fails and the next one tries again (run_node, Supervisor)
    assert time.monotonic() - started < COMMAND_TIMEOUT_S + 1.5
    assert node.redis.get("k") == b"v"
    node.redis.close()


def test_serve_on_a_cluster_without_its_address_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert serve(["smollm2-135m"], Settings(redis_cluster=1), workers=1) == 2  # nothing started
    assert "REDIS_CLUSTER=1 needs REDIS_URL" in capsys.readouterr().err
