"""Checks of the KEDA ScaledObjects, the workers they scale and the disruption budgets; lists of problems."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from shared import keys
from shared.settings import Settings
from tests.deploy.k8s_checks import (
    Doc,
    command_flag,
    find,
    ident,
    is_llmfleet,
    merged_env,
    redis_url_parts,
    workloads,
)
from tests.deploy.kustomize_lite import pod_spec
from worker.models import model_id

DATA = Path(__file__).parent / "data"


def scaledobject_schema() -> dict[str, Any]:
    """KEDA's ScaledObject v1alpha1 openAPIV3Schema, made strict as `kubectl apply` (field validation) is."""
    crd = next(d for d in yaml.safe_load_all((DATA / "keda.sh_scaledobjects.yaml").read_text()) if d)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def _strict(schema: Any) -> Any:
    """Forbid fields a schema does not list, unless it keeps unknown fields (the API server rejects them too)."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for item in schema:
            _strict(item)
    return schema


def redis_streams_keys() -> dict[str, list[str]]:
    """The trigger metadata keys KEDA's redis-streams scaler reads (tests/deploy/data, from its source)."""
    return yaml.safe_load((DATA / "keda_redis_streams_metadata.yaml").read_text())


def worker_container(deployment: Doc) -> dict[str, Any] | None:
    """The `llmfleet worker` container of a Deployment, or None."""
    return next((c for c in pod_spec(deployment)["containers"]
                 if is_llmfleet(c) and c["command"][:2] == ["llmfleet", "worker"]), None)


def _trigger_problems(trigger: dict[str, Any], where: str, *, model: str, env: dict[str, str], namespace: str,
                      docs: list[Doc]) -> list[str]:
    """One redis-streams trigger: known keys, the model's stream and group, and the Redis the workers use."""
    meta, known = trigger["metadata"], redis_streams_keys()
    allowed = set(known["keys"]) | {f"{k}FromEnv" for k in known["from_env"]}
    problems = [f"{where}: unknown redis-streams metadata {k!r}" for k in sorted(set(meta) - allowed)]
    problems += [f"{where}: missing {k!r}" for k in known["required"] if k not in meta]
    if meta.get("stream") not in keys.jobs_streams(model):
        problems.append(f"{where}: stream {meta.get('stream')!r}, the workers read {keys.jobs_streams(model)!r}")
    if "consumerGroup" in meta and meta["consumerGroup"] != keys.JOBS_GROUP:
        problems.append(f"{where}: consumerGroup {meta['consumerGroup']!r}, the workers' is {keys.JOBS_GROUP!r}")
    if ("consumerGroup" in meta) == ("streamLength" in meta):
        problems.append(f"{where}: streamLength counts only without a consumerGroup, pending entries only with one")
    host, port, db = redis_url_parts(env)
    service = find(docs, "Service", host, namespace)
    if service is None or port not in [p["port"] for p in service["spec"]["ports"]]:
        problems.append(f"{where}: REDIS_URL's {host}:{port} is no Service port in namespace {namespace}")
    expected = f"{host}.{namespace}.svc:{port}"  # KEDA runs in its own namespace: the address names ours
    if meta.get("address") != expected:
        problems.append(f"{where}: address {meta.get('address')!r}, the workers' Redis is {expected!r}")
    if int(meta.get("databaseIndex", 0)) != db:
        problems.append(f"{where}: databaseIndex {meta.get('databaseIndex')}, REDIS_URL uses {db}")
    return problems


def jobs_selector(model: str) -> str:
    """The metric selector (KEDA metrics-api, format prometheus) of all of a model's jobs on a gateway's /metrics."""
    return f'llmfleet_model_jobs{{model="{model}"}}'


def _metrics_api_problems(trigger: dict[str, Any], where: str, *, model: str, slots: int, namespace: str,
                          docs: list[Doc]) -> list[str]:
    """The metrics-api trigger: every job of the model, from a gateway Service's /metrics, under the slots."""
    meta, problems = trigger["metadata"], []
    problems += [f"{where}: missing {k!r}" for k in ("url", "valueLocation", "targetValue") if k not in meta]
    if meta.get("format") != "prometheus":
        problems.append(f"{where}: format {meta.get('format')!r}; /metrics is Prometheus text (format: prometheus)")
    if meta.get("valueLocation") != jobs_selector(model):
        problems.append(f"{where}: valueLocation {meta.get('valueLocation')!r}, expected {jobs_selector(model)!r}")
    if trigger.get("metricType", "AverageValue") != "AverageValue":
        problems.append(f"{where}: metricType {trigger['metricType']!r}: the target is per worker (AverageValue)")
    if not 0 < float(meta.get("targetValue", 0)) < slots:
        problems.append(f"{where}: targetValue {meta.get('targetValue')} must be under LLMFLEET_SLOTS ({slots})")
    url = str(meta.get("url", ""))
    host, _, rest = url.removeprefix("http://").partition(":")
    port, _, path = rest.partition("/")
    service = find(docs, "Service", host.removesuffix(f".{namespace}.svc"), namespace)
    if not host.endswith(f".{namespace}.svc") or path != "metrics" or service is None \
            or not port.isdigit() or int(port) not in [p["port"] for p in service["spec"]["ports"]]:
        problems.append(f"{where}: url {url!r} is no http://<Service>.{namespace}.svc:<port>/metrics here")
        return problems
    gateways = [d for d in workloads(docs) if d["kind"] == "Deployment" and all(
        d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())]
    for gateway in gateways:
        container = next(c for c in pod_spec(gateway)["containers"] if is_llmfleet(c))
        env, _ = merged_env(docs, container, namespace)
        if container["command"][:2] != ["llmfleet", "gateway"]:
            problems.append(f"{where}: url's Service {host} selects {ident(gateway)}, not a gateway")
        elif not Settings.from_env(env).public_metrics:
            problems.append(f"{where}: {ident(gateway)} sets LLMFLEET_PUBLIC_METRICS=0: KEDA's scrape would get 401")
    if not gateways:
        problems.append(f"{where}: url's Service {host} selects no Deployment")
    return problems


def keda_problems(docs: list[Doc]) -> list[str]:
    """Every worker Deployment has one ScaledObject on its model's stream and group, with room to scale up."""
    problems: list[str] = []
    scaled: dict[str, int] = {}
    for obj in (d for d in docs if d["kind"] == "ScaledObject"):
        spec, namespace = obj["spec"], obj["metadata"].get("namespace")
        target_ref = spec["scaleTargetRef"]
        target = find(docs, target_ref.get("kind", "Deployment"), target_ref["name"], namespace)
        container = worker_container(target) if target else None
        if container is None:
            problems.append(f"{ident(obj)}: scaleTargetRef {target_ref} is no worker Deployment here")
            continue
        scaled[target["metadata"]["name"]] = scaled.get(target["metadata"]["name"], 0) + 1
        model = model_id(command_flag(container, "--model") or "smollm2-135m")
        env, _ = merged_env(docs, container, namespace)
        if "replicas" in target["spec"]:
            problems.append(f"{ident(target)}: sets replicas, which would fight the ScaledObject on every apply")
        waits = _gateway_worker_waits(docs, namespace)
        if spec.get("minReplicaCount", 0) < 1 and (not waits or min(waits) <= 0):
            problems.append(f"{ident(obj)}: minReplicaCount 0 needs the gateways' LLMFLEET_WORKER_WAIT_S > 0: with "
                            "no worker they would refuse (503) instead of queueing, so the queue would never wake "
                            "one up")
        if spec.get("maxReplicaCount", 100) < spec.get("minReplicaCount", 0):
            problems.append(f"{ident(obj)}: maxReplicaCount below minReplicaCount")
        triggers = [t for t in spec["triggers"] if t["type"] == "redis-streams"]
        slots = Settings.from_env(env).slots
        pending = [t for t in triggers if "pendingEntriesCount" in t["metadata"]]
        if not pending:
            problems.append(f"{ident(obj)}: no redis-streams trigger on the consumer group's pending entries")
        for trigger in pending:
            target_count = int(trigger["metadata"]["pendingEntriesCount"])
            if not 0 < target_count < slots:  # a worker holds at most `slots` jobs: at target >= slots, never more
                problems.append(f"{ident(obj)}: pendingEntriesCount {target_count} must be under the workers' "
                                f"LLMFLEET_SLOTS ({slots or 'auto'}; set it explicitly)")
        lengths = {t["metadata"].get("stream") for t in triggers if "streamLength" in t["metadata"]}
        for stream in sorted(set(keys.jobs_streams(model)) - lengths):  # one stream per priority class
            problems.append(f"{ident(obj)}: no streamLength trigger on {stream}: its backlog would not scale")
        all_jobs = [t for t in spec["triggers"] if t["type"] == "metrics-api"]
        if len(all_jobs) != 1:  # the redis-streams triggers cannot name the per-worker streams placement uses
            problems.append(f"{ident(obj)}: needs one metrics-api trigger on the model's llmfleet_model_jobs, has "
                            f"{len(all_jobs)}")
        for trigger in all_jobs:
            problems += _metrics_api_problems(trigger, f"{ident(obj)} trigger {trigger.get('name', 'metrics-api')}",
                                              model=model, slots=slots or 0, namespace=namespace, docs=docs)
        for index, trigger in enumerate(triggers):
            problems += _trigger_problems(trigger, f"{ident(obj)} trigger {trigger.get('name', index)}", model=model,
                                          env=env, namespace=namespace, docs=docs)
    for deployment in (w for w in workloads(docs) if w["kind"] == "Deployment" and worker_container(w)):
        if scaled.get(deployment["metadata"]["name"], 0) != 1:
            problems.append(f"{ident(deployment)}: needs exactly one ScaledObject, has "
                            f"{scaled.get(deployment['metadata']['name'], 0)}")
    return problems


def _gateway_worker_waits(docs: list[Doc], namespace: str | None) -> list[float]:
    """LLMFLEET_WORKER_WAIT_S of every gateway container in `namespace`."""
    waits = []
    for deployment in (w for w in workloads(docs) if w["metadata"].get("namespace") == namespace):
        for container in (c for c in pod_spec(deployment)["containers"] if is_llmfleet(c)):
            if container["command"][1] == "gateway":
                waits.append(Settings.from_env(merged_env(docs, container, namespace)[0]).worker_wait_s)
    return waits


def capacity_problems(docs: list[Doc]) -> list[str]:
    """Gateways run two or more; every Deployment has a PDB that allows an eviction; BLAS threads fit the CPUs."""
    problems: list[str] = []
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for deployment in (w for w in workloads(docs) if w["kind"] == "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        own = [b for b in budgets if all(labels.get(k) == v for k, v in b["spec"]["selector"]["matchLabels"].items())]
        replicas = deployment["spec"].get("replicas")
        if len(own) != 1:
            problems.append(f"{ident(deployment)}: needs exactly one PodDisruptionBudget, has {len(own)}")
        elif "minAvailable" in own[0]["spec"] and not int(own[0]["spec"]["minAvailable"]) < (replicas or 1):
            problems.append(f"{ident(deployment)}: its PDB's minAvailable would block every eviction")
        container = next(c for c in pod_spec(deployment)["containers"] if is_llmfleet(c))
        if container["command"][1] == "gateway" and (replicas or 1) < 2:
            problems.append(f"{ident(deployment)}: one gateway is a single point of failure; run two or more")
        env, _ = merged_env(docs, container, deployment["metadata"].get("namespace"))
        threads, cpus = Settings.from_env(env).threads, container["resources"]["limits"]["cpu"]
        cores = float(cpus[:-1]) / 1000 if str(cpus).endswith("m") else float(cpus)
        if container["command"][1] == "worker" and not 0 < threads <= max(1, cores):
            problems.append(f"{ident(deployment)}: LLMFLEET_THREADS {threads} must be 1..the CPU limit ({cpus})")
    return problems
