"""Semantic checks of rendered manifests that no schema can make; each returns a list of problems (empty = fine)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmfleet.cli import build_parser
from shared.settings import ENV, Settings, SettingsError
from tests.deploy.kustomize_lite import pod_containers, pod_spec
from worker.models import CACHE_ENV

ROOT = Path(__file__).resolve().parents[2]
# Variables the pods may set besides shared/settings.py's: the model cache (worker/models.py).
EXTRA_ENV = frozenset({CACHE_ENV})
Doc = dict[str, Any]


def is_llmfleet(container: dict[str, Any]) -> bool:
    """Whether a container runs the llmfleet image (the Dockerfile's), rather than Redis."""
    return container["image"].split("@")[0].rsplit(":", 1)[0].rsplit("/", 1)[-1] == "llmfleet"


def workloads(docs: list[Doc]) -> list[Doc]:
    """Every object with a pod template."""
    return [d for d in docs if pod_spec(d) is not None]


def find(docs: list[Doc], kind: str, name: str, namespace: str | None) -> Doc | None:
    """The object of this kind and name in this namespace, or None."""
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
            return doc
    return None


def ident(doc: Doc) -> str:
    """Kind/name, as problems name an object."""
    return f"{doc['kind']}/{doc['metadata']['name']}"


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _pods_selected(docs: list[Doc], selector: dict[str, str], namespace: str | None) -> list[Doc]:
    return [w for w in workloads(docs) if w["metadata"].get("namespace") == namespace
            and _selects(selector, w["spec"]["template"]["metadata"].get("labels", {}))]


def command_flag(container: dict[str, Any], flag: str) -> str | None:
    """The value given to `flag` on a container's command line, or None."""
    argv = [*container.get("command", []), *container.get("args", [])]
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def merged_env(docs: list[Doc], container: dict[str, Any], namespace: str | None) -> tuple[dict[str, str], list[str]]:
    """The environment a container gets from envFrom ConfigMaps and env (env wins), and the problems found."""
    env: dict[str, str] = {}
    problems: list[str] = []
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef", {}).get("name")
        config_map = find(docs, "ConfigMap", ref, namespace) if ref else None
        if config_map is None:
            problems.append(f"container {container['name']}: envFrom {source} names no ConfigMap here")
            continue
        env.update({k: str(v) for k, v in config_map.get("data", {}).items()})
    for item in container.get("env", []):
        if "value" not in item:
            problems.append(f"container {container['name']}: {item['name']} is not a plain value")
            continue
        env[item["name"]] = str(item["value"])
    return env, problems


def env_problems(docs: list[Doc]) -> list[str]:
    """Every variable an llmfleet container gets is a real setting, and together they parse as Settings."""
    problems: list[str] = []
    known = set(ENV.values()) | EXTRA_ENV
    for workload in workloads(docs):
        for container in filter(is_llmfleet, pod_containers(workload)):
            env, found = merged_env(docs, container, workload["metadata"].get("namespace"))
            problems += found
            problems += [f"{ident(workload)}/{container['name']}: {name} is not a Settings variable"
                         for name in sorted(set(env) - known)]
            try:
                Settings.from_env(env)
            except SettingsError as exc:
                problems.append(f"{ident(workload)}/{container['name']}: {exc}")
    return problems


def selector_problems(docs: list[Doc]) -> list[str]:
    """Workload selectors match their own pods only; Services, PDBs and NetworkPolicies select some pods."""
    problems: list[str] = []
    for workload in workloads(docs):
        selector = workload["spec"]["selector"]["matchLabels"]
        namespace = workload["metadata"].get("namespace")
        if not _selects(selector, workload["spec"]["template"]["metadata"].get("labels", {})):
            problems.append(f"{ident(workload)}: selector {selector} does not match its pod labels")
        others = [w for w in _pods_selected(docs, selector, namespace) if w is not workload]
        problems += [f"{ident(workload)}: selector also matches {ident(o)}'s pods" for o in others]
        for spread in pod_spec(workload).get("topologySpreadConstraints", []):
            if not _selects(spread["labelSelector"]["matchLabels"], workload["spec"]["template"]["metadata"]["labels"]):
                problems.append(f"{ident(workload)}: a topology spread constraint does not count its own pods")
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] == "Service":
            selector = doc["spec"].get("selector", {})
        elif doc["kind"] == "PodDisruptionBudget":
            selector = doc["spec"]["selector"].get("matchLabels", {})
        elif doc["kind"] == "NetworkPolicy":
            selector = doc["spec"]["podSelector"].get("matchLabels", {})
        else:
            continue
        if not _pods_selected(docs, selector, namespace):
            problems.append(f"{ident(doc)}: selector {selector} matches no pods")
    return problems


def container_port(container: dict[str, Any], port: int | str) -> int | None:
    """A container's port number for a probe's or Service's port (a name or a number), or None."""
    for item in container.get("ports", []):
        if port in (item.get("name"), item["containerPort"]):
            return int(item["containerPort"])
    return None


def service_problems(docs: list[Doc]) -> list[str]:
    """Every Service port reaches a declared container port of every pod it selects."""
    problems: list[str] = []
    for service in (d for d in docs if d["kind"] == "Service"):
        namespace = service["metadata"].get("namespace")
        for workload in _pods_selected(docs, service["spec"].get("selector", {}), namespace):
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                if not any(container_port(c, target) for c in pod_spec(workload)["containers"]):
                    problems.append(f"{ident(service)}: targetPort {target} is no container port of {ident(workload)}")
        governs = any(w["spec"].get("serviceName") == service["metadata"]["name"] for w in workloads(docs))
        if governs and service["spec"].get("clusterIP") != "None":
            problems.append(f"{ident(service)}: a StatefulSet's serviceName must be a headless Service")
    for workload in (w for w in workloads(docs) if w["kind"] == "StatefulSet"):
        if find(docs, "Service", workload["spec"]["serviceName"], workload["metadata"].get("namespace")) is None:
            problems.append(f"{ident(workload)}: serviceName {workload['spec']['serviceName']} is no Service here")
    return problems


def probe_problems(docs: list[Doc]) -> list[str]:
    """Gateways: readiness on /ready/gateway and liveness on /health at the port they listen on; workers: the healthcheck."""
    problems: list[str] = []
    parser = build_parser()
    for workload in workloads(docs):
        for container in filter(is_llmfleet, pod_containers(workload)):
            where = f"{ident(workload)}/{container['name']}"
            argv = container["command"]
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit:
                problems.append(f"{where}: `{shlex.join(argv)}` is not an llmfleet command")
                continue
            if args.command == "gateway":
                listen = int(command_flag(container, "--port") or Settings().port)
                if container_port(container, listen) is None:
                    problems.append(f"{where}: listens on {listen}, which is no declared container port")
                for probe, path in (("readinessProbe", "/ready/gateway"), ("livenessProbe", "/health")):
                    get = container.get(probe, {}).get("httpGet", {})
                    if get.get("path") != path or container_port(container, get.get("port", -1)) != listen:
                        problems.append(f"{where}: {probe} must GET {path} on port {listen}, not {get}")
            elif args.command == "worker":
                for probe in ("startupProbe", "livenessProbe"):
                    command = container.get(probe, {}).get("exec", {}).get("command", [])
                    if command != ["llmfleet", "healthcheck", "worker"]:
                        problems.append(f"{where}: {probe} must run `llmfleet healthcheck worker`, not {command}")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command")
                if command and command[0] == "llmfleet":
                    parser.parse_args(command[1:])
    return problems


def _sleep_seconds(container: dict[str, Any]) -> float:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def grace_problems(docs: list[Doc]) -> list[str]:
    """terminationGracePeriodSeconds exceeds the preStop pause plus the drain timeout of every llmfleet pod."""
    problems: list[str] = []
    for workload in workloads(docs):
        spec = pod_spec(workload)
        grace = spec.get("terminationGracePeriodSeconds", 30)  # the Kubernetes default
        for container in filter(is_llmfleet, spec["containers"]):
            env, _ = merged_env(docs, container, workload["metadata"].get("namespace"))
            needed = Settings.from_env(env).drain_timeout_s + _sleep_seconds(container)
            if not grace > needed:
                problems.append(f"{ident(workload)}: terminationGracePeriodSeconds {grace} <= {needed} "
                                "(preStop + LLMFLEET_DRAIN_TIMEOUT_S): draining pods would be killed")
    return problems


def dockerfile_facts() -> dict[str, str]:
    """The Dockerfile's user id, exposed port and model cache, and the image tag (the package version)."""
    text = (ROOT / "Dockerfile").read_text()
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    return {"uid": re.search(r"--uid (\d+)", text)[1], "port": re.search(r"^EXPOSE (\d+)", text, re.M)[1],
            "cache": re.search(rf"{CACHE_ENV}=(\S+)", text)[1], "image": f"llmfleet:{version[1]}"}


def image_problems(docs: list[Doc]) -> list[str]:
    """llmfleet containers run the Dockerfile's image as its user, serve its port and mount its model cache."""
    facts = dockerfile_facts()
    problems: list[str] = []
    for workload in workloads(docs):
        spec = pod_spec(workload)
        for container in filter(is_llmfleet, pod_containers(workload)):
            where = f"{ident(workload)}/{container['name']}"
            if container["image"] != facts["image"]:
                problems.append(f"{where}: image {container['image']}, expected {facts['image']}")
            uid = container.get("securityContext", {}).get("runAsUser", spec.get("securityContext", {}).get("runAsUser"))
            if str(uid) != facts["uid"]:
                problems.append(f"{where}: runs as uid {uid}, the Dockerfile's user is {facts['uid']}")
            env, _ = merged_env(docs, container, workload["metadata"].get("namespace"))
            cache = env.get(CACHE_ENV)
            if cache is not None or container["command"][1] in ("worker", "pull"):
                mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
                if (cache or facts["cache"]) != facts["cache"] or facts["cache"] not in mounts:
                    problems.append(f"{where}: the model cache must be the Dockerfile's {facts['cache']}, mounted")
            if command_flag(container, "--port") not in (None, facts["port"]):
                problems.append(f"{where}: listens on {command_flag(container, '--port')}; the image exposes {facts['port']}")
    return problems


def security_problems(docs: list[Doc]) -> list[str]:
    """Non-root, no privilege escalation, read-only root file systems, resources, readable Secret mounts."""
    problems: list[str] = []
    for workload in workloads(docs):
        spec = pod_spec(workload)
        pod_ctx = spec.get("securityContext", {})
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{ident(workload)}: mounts a service account token it does not need")
        for container in pod_containers(workload):
            where = f"{ident(workload)}/{container['name']}"
            ctx = {**pod_ctx, **container.get("securityContext", {})}
            wanted = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
            problems += [f"{where}: securityContext {k} must be {v}" for k, v in wanted.items() if ctx.get(k) is not v]
            if ctx.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{where}: must drop all capabilities")
            for bound in ("requests", "limits"):
                if set(container.get("resources", {}).get(bound, {})) < {"cpu", "memory"}:
                    problems.append(f"{where}: resources.{bound} must set cpu and memory")
            for mount in container.get("volumeMounts", []):
                volume = volumes.get(mount["name"])
                if volume is None and mount["name"] not in claims:
                    problems.append(f"{where}: mounts {mount['name']}, which is no volume of the pod")
                elif volume and "secret" in volume:
                    mode = volume["secret"].get("defaultMode", 0o644)
                    if not (mode & 0o004 or (pod_ctx.get("fsGroup") is not None and mode & 0o040)):
                        problems.append(f"{where}: Secret volume {mount['name']} (mode {mode:o}) is unreadable for uid "
                                        f"{ctx.get('runAsUser')}")
            if is_llmfleet(container) and "/tmp" not in [m["mountPath"] for m in container.get("volumeMounts", [])]:
                problems.append(f"{where}: a read-only root file system needs a writable /tmp")
    return problems


def keys_file_problems(docs: list[Doc]) -> list[str]:
    """LLMFLEET_KEYS_FILE is a key of a Secret mounted (as a directory, so updates arrive) where it points."""
    problems: list[str] = []
    for workload in workloads(docs):
        spec, namespace = pod_spec(workload), workload["metadata"].get("namespace")
        for container in filter(is_llmfleet, spec["containers"]):
            env, _ = merged_env(docs, container, namespace)
            path = env.get(ENV["keys_file"])
            if path is None:
                continue
            volume_name = next((m["name"] for m in container.get("volumeMounts", [])
                                if m["mountPath"].rstrip("/") == str(Path(path).parent) and "subPath" not in m), None)
            volume = next((v for v in spec.get("volumes", []) if v["name"] == volume_name), {})
            secret = find(docs, "Secret", volume.get("secret", {}).get("secretName", ""), namespace)
            if secret is None or Path(path).name not in {**secret.get("data", {}), **secret.get("stringData", {})}:
                problems.append(f"{ident(workload)}: {ENV['keys_file']}={path} is not a mounted Secret's key")
    return problems


def redis_url_parts(env: dict[str, str]) -> tuple[str, int, int]:
    """Host, port and database index of REDIS_URL."""
    url = urlsplit(Settings.from_env(env).redis_url)
    return url.hostname or "", url.port or 6379, int(url.path.strip("/") or 0)


def redis_problems(docs: list[Doc]) -> list[str]:
    """Each Redis server's StatefulSet (the primary's, a replica's; not the sentinels'): one pod, append-only on,
    its --dir on a PersistentVolumeClaim."""
    problems: list[str] = []
    for workload in (w for w in workloads(docs) if w["kind"] == "StatefulSet"):
        for container in (c for c in workload["spec"]["template"]["spec"]["containers"]
                          if c["image"].startswith("redis:")):
            argv = [*container.get("command", []), *container.get("args", [])]
            if "--sentinel" in argv:
                continue
            claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
            on_claims = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in claims]
            if command_flag(container, "--appendonly") != "yes":
                problems.append(f"{ident(workload)}: Redis without --appendonly yes loses every queued job on a restart")
            if command_flag(container, "--dir") not in on_claims:
                problems.append(f"{ident(workload)}: --dir {command_flag(container, '--dir')} is not on a "
                                f"PersistentVolumeClaim ({on_claims})")
            if workload["spec"].get("replicas", 1) != 1 or argv[:1] != ["redis-server"]:
                problems.append(f"{ident(workload)}: one redis-server, not replicas")
    return problems
