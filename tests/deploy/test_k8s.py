"""deploy/k8s: rendered offline, every object validates against the Kubernetes or KEDA schema, and the parts fit."""

from __future__ import annotations

import base64
import copy
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.http import api_keys
from tests.deploy.k8s_checks import (
    env_problems,
    grace_problems,
    image_problems,
    keys_file_problems,
    probe_problems,
    redis_problems,
    security_problems,
    selector_problems,
    service_problems,
)
from tests.deploy.keda_checks import capacity_problems, keda_problems, scaledobject_schema
from tests.deploy.kustomize_lite import KustomizeError, render

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZATIONS = {"base": ROOT / "deploy/k8s/base", "gemma": ROOT / "deploy/k8s/overlays/gemma",
                  "ha": ROOT / "deploy/k8s/overlays/ha"}
OLDEST_K8S = "1.29"  # the oldest Kubernetes the manifests are checked against; the newest the validator ships too
CHECKS = [env_problems, selector_problems, service_problems, probe_problems, grace_problems, image_problems,
          security_problems, keys_file_problems, redis_problems, keda_problems, capacity_problems]
Docs = list[dict[str, Any]]

try:
    import kubernetes_validate
except ImportError:  # in the dev extra; without it only the schema tests skip
    kubernetes_validate = None


@pytest.fixture(scope="module", params=sorted(KUSTOMIZATIONS))
def rendered(request: pytest.FixtureRequest) -> Docs:
    return render(KUSTOMIZATIONS[request.param])


@pytest.fixture()
def base() -> Docs:
    return render(KUSTOMIZATIONS["base"])


def _get(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _names(docs: Docs) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_base_renders_the_whole_topology(base: Docs) -> None:
    worker = "llmfleet-worker-smollm2-135m"
    assert _names(base) == {
        ("Namespace", "llmfleet"), ("ConfigMap", "llmfleet-settings"), ("Secret", "llmfleet-api-keys"),
        ("StatefulSet", "redis"), ("Service", "redis"), ("Service", "redis-headless"), ("NetworkPolicy", "redis"),
        ("Deployment", "llmfleet-gateway"), ("Service", "llmfleet-gateway"), ("PodDisruptionBudget", "llmfleet-gateway"),
        ("Deployment", worker), ("ScaledObject", worker), ("PodDisruptionBudget", worker)}
    assert {c["image"] for c in _get(base, "Deployment", worker)["spec"]["template"]["spec"]["containers"]} == {"llmfleet:0.1.0"}


def test_everything_lands_in_one_namespace(rendered: Docs) -> None:
    [namespace] = [d["metadata"]["name"] for d in rendered if d["kind"] == "Namespace"]
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"} == {namespace}


def test_gemma_overlay_adds_only_gemma_workers(base: Docs) -> None:
    gemma = render(KUSTOMIZATIONS["gemma"])
    name = "llmfleet-worker-gemma3-270m"
    assert _names(gemma) - _names(base) == {("Deployment", name), ("ScaledObject", name), ("PodDisruptionBudget", name)}
    triggers = _get(gemma, "ScaledObject", name)["spec"]["triggers"]
    assert triggers[0]["metadata"]["valueLocation"] == 'llmfleet_model_jobs{model="gemma3-270m"}'
    assert triggers[1]["metadata"]["stream"] == "llmfleet:{gemma3-270m}:jobs"



def test_ha_overlay_adds_a_replica_and_three_sentinels_that_every_pod_asks(base: Docs) -> None:
    from shared.settings import Settings

    ha = render(KUSTOMIZATIONS["ha"])
    assert {kind for kind, _ in _names(ha) - _names(base)} == {"StatefulSet", "Service", "ConfigMap",
                                                               "NetworkPolicy", "PodDisruptionBudget"}
    sentinels = _get(ha, "StatefulSet", "redis-sentinel")
    settings = _get(ha, "ConfigMap", "llmfleet-settings")["data"]
    target = Settings.from_env(settings).redis_target
    headless = f"{sentinels['spec']['serviceName']}.llmfleet.svc.cluster.local"
    assert [h for h, _ in target.sentinels] == [f"redis-sentinel-{i}.{headless}" for i in range(3)]
    assert sentinels["spec"]["replicas"] == 3
    monitor = next(line.split() for line in _get(ha, "ConfigMap", "redis-sentinel")["data"]["sentinel.conf"].splitlines()
                   if line.startswith("sentinel monitor"))
    assert monitor[2] == target.master and monitor[3] == "redis-0.redis-headless.llmfleet.svc.cluster.local"
    args = _get(ha, "StatefulSet", "redis-replica")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--replicaof") + 1:][:2] == monitor[3:5]

@pytest.mark.skipif(kubernetes_validate is None, reason="kubernetes-validate is not installed (pip install -e '.[dev]')")
@pytest.mark.parametrize("version", [OLDEST_K8S, "latest"])
def test_every_object_validates_against_the_kubernetes_schemas(rendered: Docs, version: str) -> None:
    version = kubernetes_validate.latest_version() if version == "latest" else version
    for doc in rendered:
        if doc["kind"] == "ScaledObject":
            continue  # a CRD: checked against KEDA's schema below
        assert kubernetes_validate.validate(doc, version, strict=True), doc["metadata"]["name"]


def test_scaledobjects_validate_against_kedas_crd(rendered: Docs) -> None:
    validator = jsonschema.Draft7Validator(scaledobject_schema())
    objects = [d for d in rendered if d["kind"] == "ScaledObject"]
    assert objects
    for obj in objects:
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
        assert errors == [], obj["metadata"]["name"]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_semantic_links_hold(rendered: Docs, check: Callable[[Docs], list[str]]) -> None:
    assert check(rendered) == []


def test_the_shipped_api_key_file_parses_and_admits_no_key(base: Docs, tmp_path: Path) -> None:
    secret = _get(base, "Secret", "llmfleet-api-keys")
    path = tmp_path / "keys.json"
    path.write_bytes(base64.b64decode(secret["data"]["keys.json"]))
    assert api_keys.load(path) == []  # every /v1 request is refused until the operator adds a key
    assert api_keys.KeyStore(path).enabled


def test_a_key_added_with_the_cli_reaches_the_gateways_secret(tmp_path: Path) -> None:
    base = tmp_path / "base"
    shutil.copytree(KUSTOMIZATIONS["base"], base)
    key = api_keys.add(base / "keys.json", "team-a", rpm=60)  # `llmfleet keys add team-a --rpm 60 --file ...`
    secret = _get(render(base), "Secret", "llmfleet-api-keys")
    mounted = tmp_path / "keys.json"
    mounted.write_bytes(base64.b64decode(secret["data"]["keys.json"]))
    record = api_keys.KeyStore(mounted).lookup(key)
    assert record is not None and record.name == "team-a" and record.rpm == 60
    assert key not in mounted.read_text()  # only its digest travels


# ---- the validators and checks do fail on broken manifests -----------------------------------------------------

def _worker(docs: Docs) -> dict[str, Any]:
    return _get(docs, "Deployment", "llmfleet-worker-smollm2-135m")


def _gateway_container(docs: Docs) -> dict[str, Any]:
    return _get(docs, "Deployment", "llmfleet-gateway")["spec"]["template"]["spec"]["containers"][0]


def _worker_container(docs: Docs) -> dict[str, Any]:
    return _worker(docs)["spec"]["template"]["spec"]["containers"][0]


def _trigger(docs: Docs, index: int = 0) -> dict[str, str]:
    triggers = _get(docs, "ScaledObject", "llmfleet-worker-smollm2-135m")["spec"]["triggers"]
    return [t for t in triggers if t["type"] == "redis-streams"][index]["metadata"]


def _jobs_trigger(docs: Docs) -> dict[str, str]:
    triggers = _get(docs, "ScaledObject", "llmfleet-worker-smollm2-135m")["spec"]["triggers"]
    return next(t for t in triggers if t["type"] == "metrics-api")["metadata"]


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    container["env"] = [e for e in container["env"] if e["name"] != name] + [{"name": name, "value": value}]


BROKEN: list[tuple[str, Callable[[Docs], None], Callable[[Docs], list[str]], str]] = [
    ("unknown setting", lambda d: _get(d, "ConfigMap", "llmfleet-settings")["data"].update(LLMFLEET_QUEUE=1),
     env_problems, "LLMFLEET_QUEUE is not a Settings variable"),
    ("bad setting value", lambda d: _get(d, "ConfigMap", "llmfleet-settings")["data"].update(LLMFLEET_QUEUE_LIMIT="0"),
     env_problems, "LLMFLEET_QUEUE_LIMIT: must be >= 1"),
    ("pod labels off the selector", lambda d: _worker(d)["spec"]["template"]["metadata"]["labels"].update(
        {"llmfleet/model": "other"}), selector_problems, "does not match its pod labels"),
    ("spread over other pods", lambda d: _worker(d)["spec"]["template"]["spec"]["topologySpreadConstraints"][0]
     ["labelSelector"]["matchLabels"].update({"llmfleet/model": "gemma3-270m"}), selector_problems,
     "does not count its own pods"),
    ("Service to a port nobody has", lambda d: _get(d, "Service", "llmfleet-gateway")["spec"]["ports"][0].update(
        targetPort=8080), service_problems, "targetPort 8080 is no container port"),
    ("readiness on /health", lambda d: _gateway_container(d)["readinessProbe"]["httpGet"].update(path="/health"),
     probe_problems, "readinessProbe must GET /ready/gateway"),
    ("liveness on another port", lambda d: _gateway_container(d)["livenessProbe"]["httpGet"].update(port=9000),
     probe_problems, "livenessProbe must GET /health on port 8000"),
    ("grace shorter than the drain", lambda d: _get(d, "Deployment", "llmfleet-gateway")["spec"]["template"]["spec"]
     .update(terminationGracePeriodSeconds=60), grace_problems, "terminationGracePeriodSeconds 60 <= 65.0"),
    ("another image tag", lambda d: _worker_container(d).update(image="llmfleet:0.0.9"), image_problems,
     "image llmfleet:0.0.9, expected llmfleet:0.1.0"),
    ("root user", lambda d: _worker(d)["spec"]["template"]["spec"]["securityContext"].update(runAsUser=0),
     image_problems, "runs as uid 0"),
    ("writable root fs", lambda d: _gateway_container(d)["securityContext"].update(readOnlyRootFilesystem=False),
     security_problems, "readOnlyRootFilesystem must be True"),
    ("unreadable Secret", lambda d: _get(d, "Deployment", "llmfleet-gateway")["spec"]["template"]["spec"]["volumes"][0]
     ["secret"].update(defaultMode=0o400), security_problems, "is unreadable for uid 1000"),
    ("keys file not in the Secret", lambda d: _set_env(_gateway_container(d), "LLMFLEET_KEYS_FILE", "/etc/llmfleet/keys/k"),
     keys_file_problems, "is not a mounted Secret's key"),
    ("Redis without AOF", lambda d: _get(d, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]
     .update(args=["redis-server", "--appendonly", "no", "--dir", "/data"]), redis_problems, "--appendonly yes"),
    ("another stream", lambda d: _trigger(d).update(stream="llmfleet:{smollm2}:jobs"), keda_problems,
     "the workers read ['llmfleet:{smollm2-135m}:jobs@critical'"),
    ("another group", lambda d: _trigger(d).update(consumerGroup="worker"), keda_problems, "the workers' is 'workers'"),
    ("a misspelt metadata key", lambda d: _trigger(d).update(consumergroup="workers"), keda_problems,
     "unknown redis-streams metadata 'consumergroup'"),
    ("Redis address without the namespace", lambda d: _trigger(d, 1).update(address="redis:6379"), keda_problems,
     "the workers' Redis is 'redis.llmfleet.svc:6379'"),
    ("target at the slots", lambda d: _trigger(d).update(pendingEntriesCount="16"), keda_problems,
     "pendingEntriesCount 16 must be under the workers' LLMFLEET_SLOTS (16"),
    ("jobs metric of another model", lambda d: _jobs_trigger(d).update(valueLocation='llmfleet_model_jobs{model="x"}'),
     keda_problems, "expected 'llmfleet_model_jobs{model=\"smollm2-135m\"}'"),
    ("jobs metric as JSON", lambda d: _jobs_trigger(d).update(format="json"), keda_problems, "format 'json'"),
    ("jobs metric from no Service", lambda d: _jobs_trigger(d).update(url="http://gateway.llmfleet.svc:8000/metrics"),
     keda_problems, "is no http://<Service>.llmfleet.svc:<port>/metrics"),
    ("jobs metric closed", lambda d: _get(d, "ConfigMap", "llmfleet-settings")["data"].update(
        LLMFLEET_PUBLIC_METRICS="0"), keda_problems, "KEDA's scrape would get 401"),
    ("no jobs metric", lambda d: _get(d, "ScaledObject", "llmfleet-worker-smollm2-135m")["spec"].update(
        triggers=[t for t in _get(d, "ScaledObject", "llmfleet-worker-smollm2-135m")["spec"]["triggers"]
                  if t["type"] != "metrics-api"]), keda_problems, "needs one metrics-api trigger"),
    ("scale to zero without a wait", lambda d: (
        _get(d, "ScaledObject", "llmfleet-worker-smollm2-135m")["spec"].update(minReplicaCount=0),
        _get(d, "ConfigMap", "llmfleet-settings")["data"].update(LLMFLEET_WORKER_WAIT_S="0")),
     keda_problems, "minReplicaCount 0 needs the gateways' LLMFLEET_WORKER_WAIT_S > 0"),
    ("replicas beside KEDA", lambda d: _worker(d)["spec"].update(replicas=3), keda_problems, "would fight"),
    ("one gateway", lambda d: _get(d, "Deployment", "llmfleet-gateway")["spec"].update(replicas=1), capacity_problems,
     "single point of failure"),
    ("more threads than CPUs", lambda d: _set_env(_worker_container(d), "LLMFLEET_THREADS", "8"), capacity_problems,
     "LLMFLEET_THREADS 8 must be 1..the CPU limit"),
]


@pytest.mark.parametrize(("mutate", "check", "expected"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_checks_catch_a_broken_manifest(base: Docs, mutate: Callable[[Docs], None],
                                        check: Callable[[Docs], list[str]], expected: str) -> None:
    assert check(base) == []
    mutate(base)
    problems = check(base)
    assert any(expected in p for p in problems), problems


@pytest.mark.skipif(kubernetes_validate is None, reason="kubernetes-validate is not installed (pip install -e '.[dev]')")
@pytest.mark.parametrize("mutate", [
    lambda d: _get(d, "Deployment", "llmfleet-gateway")["spec"].update(replica=2),  # an unknown field
    lambda d: _gateway_container(d)["ports"][0].update(containerPort="8000"),  # a string for an integer
    lambda d: _get(d, "PodDisruptionBudget", "llmfleet-gateway")["spec"].pop("selector") and
    _get(d, "PodDisruptionBudget", "llmfleet-gateway")["spec"].update(selectors={}),
], ids=["unknown field", "wrong type", "misspelt selector"])
def test_the_kubernetes_validator_rejects_broken_objects(base: Docs, mutate: Callable[[Docs], None]) -> None:
    mutate(base)
    with pytest.raises(kubernetes_validate.ValidationError):
        for doc in base:
            if doc["kind"] != "ScaledObject":
                kubernetes_validate.validate(doc, OLDEST_K8S, strict=True)


@pytest.mark.parametrize("mutate", [
    lambda so: so["spec"].update(minReplicas=1),
    lambda so: so["spec"]["triggers"][0].pop("type"),
    lambda so: so["spec"].update(maxReplicaCount="8"),
], ids=["unknown field", "trigger without a type", "wrong type"])
def test_kedas_schema_rejects_broken_scaledobjects(base: Docs, mutate: Callable[[dict[str, Any]], None]) -> None:
    obj = copy.deepcopy(_get(base, "ScaledObject", "llmfleet-worker-smollm2-135m"))
    mutate(obj)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, scaledobject_schema(), cls=jsonschema.Draft7Validator)


def test_renderer_applies_namespace_and_images_and_refuses_what_it_cannot_render(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "llmfleet"}]}}}}))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "namespace": "ns", "resources": ["pod.yaml"], "images": [{"name": "llmfleet", "newName": "r/llmfleet",
                                                                   "newTag": "1"}]}))
    [doc] = render(tmp_path)
    assert doc["metadata"]["namespace"] == "ns"
    assert doc["spec"]["template"]["spec"]["containers"][0]["image"] == "r/llmfleet:1"
    inline = [{"patch": "{}", "target": {"kind": "Deployment"}}]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["pod.yaml"], "patches": inline}))
    with pytest.raises(KustomizeError, match="patches"):
        render(tmp_path)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: no reference kustomize here")
@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_renderer_agrees_with_kubectl_kustomize(name: str) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(KUSTOMIZATIONS[name])], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    def key(doc: dict[str, Any]) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]

    reference = {key(d): d for d in yaml.safe_load_all(out) if d}
    assert reference == {key(d): d for d in render(KUSTOMIZATIONS[name])}
