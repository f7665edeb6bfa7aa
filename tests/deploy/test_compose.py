"""docker-compose.yml and the Dockerfile: the topology the issue asks for (no Docker engine needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services(compose: dict) -> None:
    assert set(compose["services"]) == {"redis", "gateway", "worker", "worker-gemma", "batch-runner"}
    assert compose["services"]["worker-gemma"]["profiles"] == ["gemma"]  # only with --profile gemma


def test_redis_is_not_published(compose: dict) -> None:
    redis = compose["services"]["redis"]
    assert "ports" not in redis and "healthcheck" in redis


def test_gateway_on_port_8000(compose: dict) -> None:
    gateway = compose["services"]["gateway"]
    assert any(str(p).split(":")[-1] == "8000" for p in gateway["ports"])
    assert gateway["environment"]["REDIS_URL"].startswith("redis://redis:")
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "llmfleet" in gateway["healthcheck"]["test"]


@pytest.mark.parametrize("name", ["worker", "worker-gemma"])
def test_worker_scales(compose: dict, name: str) -> None:
    worker = compose["services"][name]
    assert "container_name" not in worker and "ports" not in worker  # --scale worker=N works
    assert worker["environment"]["REDIS_URL"].startswith("redis://redis:")
    cache = worker["environment"]["LLMFLEET_CACHE"]
    assert any(v.split(":")[1] == cache and v.split(":")[0] in compose["volumes"] for v in worker["volumes"])
    assert worker["command"][:2] == ["llmfleet", "worker"] and "healthcheck" in worker
    assert worker["stop_signal"] == "SIGTERM"


def test_dockerfile_installs_the_package_and_runs_as_a_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install ." in text and "USER " in text and "EXPOSE 8000" in text
    for package in ("gateway", "worker", "shared", "llmfleet", "batches"):
        assert f"COPY {package} " in text


def test_commands_in_compose_exist(compose: dict) -> None:
    from llmfleet.cli import build_parser

    parser = build_parser()
    for name in ("gateway", "worker", "worker-gemma", "batch-runner"):
        service = compose["services"][name]
        parser.parse_args(service["command"][1:])
        parser.parse_args(service["healthcheck"]["test"][2:])


def test_stop_grace_covers_the_drain_timeout(compose: dict) -> None:
    for name in ("gateway", "worker", "worker-gemma"):
        service = compose["services"][name]
        drain = float(service["environment"]["LLMFLEET_DRAIN_TIMEOUT_S"])
        assert service["stop_signal"] == "SIGTERM"
        assert float(service["stop_grace_period"].rstrip("s")) > drain


def test_batch_runner(compose: dict) -> None:
    runner = compose["services"]["batch-runner"]
    assert runner["command"] == ["llmfleet", "batch-runner"] and "ports" not in runner
    assert runner["environment"]["REDIS_URL"].startswith("redis://redis:")
    assert runner["depends_on"]["redis"]["condition"] == "service_healthy" and runner["stop_signal"] == "SIGTERM"


def _interpolate(value: str, shell: dict[str, str]) -> str:
    """Compose's ${VAR:-default} substitution (the only form the file uses)."""
    import re

    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: shell.get(m.group(1)) or m.group(2), value)


@pytest.mark.parametrize(("shell", "published", "starts"), [
    ({}, "127.0.0.1", "quietly"),  # `docker compose up` as it comes: loopback only, no key needed
    ({"LLMFLEET_PUBLISH": "0.0.0.0"}, "0.0.0.0", "refused"),  # widened with no key: refused, not open
    ({"LLMFLEET_PUBLISH": "0.0.0.0", "LLMFLEET_API_KEY": "k"}, "0.0.0.0", "quietly"),
    ({"LLMFLEET_PUBLISH": "0.0.0.0", "LLMFLEET_ALLOW_OPEN": "1"}, "0.0.0.0", "warns"),
])
def test_the_gateway_is_published_on_loopback_unless_a_key_or_the_opt_in_says_otherwise(
        compose: dict, shell: dict[str, str], published: str, starts: str) -> None:
    from gateway.http.exposure import OpenEndpointRefused, check_exposure
    from shared.settings import Settings

    gateway = compose["services"]["gateway"]
    [port] = [_interpolate(str(p), shell) for p in gateway["ports"]]
    assert port == f"{published}:8000:8000"
    env = {name: _interpolate(str(value), shell) for name, value in gateway["environment"].items()}
    host = gateway["command"][gateway["command"].index("--host") + 1]
    settings = Settings.from_env({**env, "LLMFLEET_HOST": host})
    if starts == "refused":
        with pytest.raises(OpenEndpointRefused):
            check_exposure(settings)
    else:
        assert (check_exposure(settings) is None) is (starts == "quietly")


def test_the_kubernetes_gateway_takes_its_keys_from_the_secret() -> None:
    from gateway.http.exposure import check_exposure
    from shared.settings import Settings

    manifest = (ROOT / "deploy" / "k8s" / "base" / "gateway.yaml").read_text()
    assert "LLMFLEET_KEYS_FILE" in manifest and "secretName: llmfleet-api-keys" in manifest
    settings = Settings.from_env({"LLMFLEET_HOST": "0.0.0.0", "LLMFLEET_KEYS_FILE": "/etc/llmfleet/keys/keys.json"})
    assert check_exposure(settings) is None  # so it binds 0.0.0.0 in the pod and starts


def test_the_ha_variant_runs_a_primary_a_replica_and_three_sentinels_every_process_asks(compose: dict) -> None:
    from shared.settings import Settings

    ha = yaml.safe_load((ROOT / "docker-compose.ha.yml").read_text())["services"]
    sentinels = sorted(name for name, service in ha.items() if "--sentinel" in " ".join(service.get("command", [])))
    assert sentinels == ["sentinel-1", "sentinel-2", "sentinel-3"]
    replica = ha["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1:][:2] == ["redis", "6379"]
    for name in ("redis", "redis-replica"):  # a primary restarted empty would empty its replica too
        assert ha[name]["command"][ha[name]["command"].index("--appendonly") + 1] == "yes"
    monitor = next(line.split() for line in ha["sentinel-1"]["command"][2].splitlines()
                   if line.strip().startswith("sentinel monitor"))
    for name in ("gateway", "worker", "worker-gemma", "batch-runner"):
        assert name in compose["services"]
        env = {k: v for k, v in {**compose["services"][name]["environment"], **ha[name]["environment"]}.items()
               if "${" not in str(v)}  # what compose interpolates from the host's environment
        target = Settings.from_env(env).redis_target
        assert sorted(host for host, _ in target.sentinels) == sentinels and target.master == monitor[2]
        assert set(sentinels) <= set(ha[name]["depends_on"])
