"""Render deploy/k8s's kustomizations as `kubectl apply -k` would, for the few features they use; no binary."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "namespace", "resources", "secretGenerator", "images", "patches"})
CLUSTER_SCOPED_KINDS = frozenset({"Namespace"})
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job"})


class KustomizeError(ValueError):
    """A kustomization uses something this renderer does not implement, or renders duplicate objects."""


def render(directory: Path) -> list[dict[str, Any]]:
    """Every object of the kustomization in `directory`, with its namespace and image transformers applied."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{directory}: kustomization fields not rendered here: {sorted(unknown)}")
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs.extend(render(path))
        else:
            docs.extend(copy.deepcopy(doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    docs.extend(_generate_secret(directory, spec) for spec in kustomization.get("secretGenerator", []))
    for spec in kustomization.get("patches", []):
        _apply_patch(directory, spec, docs)
    namespace = kustomization.get("namespace")
    if namespace:
        for doc in docs:
            if doc["kind"] in CLUSTER_SCOPED_KINDS:
                if doc["kind"] == "Namespace":  # as kustomize does: the Namespace object is renamed too
                    doc["metadata"]["name"] = namespace
            else:
                doc["metadata"]["namespace"] = namespace
    for image in kustomization.get("images", []):
        for container in (c for doc in docs for c in pod_containers(doc)):
            _set_image(container, image)
    seen: set[tuple[str, str, str]] = set()
    for doc in docs:
        ident = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        if ident in seen:
            raise KustomizeError(f"{directory}: {ident} is defined twice")
        seen.add(ident)
    return docs


def _apply_patch(directory: Path, spec: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """A strategic-merge patch from a file (`patches: [{path: ...}]`), maps only: it merges into the object of its
    kind and name (a list in a patch would need kustomize's merge keys, not rendered here)."""
    if set(spec) != {"path"}:
        raise KustomizeError(f"{directory}: patches: only {{path: file}} entries are rendered here")
    patch = yaml.safe_load((directory / spec["path"]).read_text())
    target = next((d for d in docs if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"]),
                  None)
    if target is None:
        raise KustomizeError(f"{directory}: patch {spec['path']} matches no object")
    _merge(target, {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}, f"{directory}/{spec['path']}")


def _merge(into: dict[str, Any], patch: dict[str, Any], where: str) -> None:
    for key, value in patch.items():
        if isinstance(value, list):
            raise KustomizeError(f"{where}: a list ({key}) in a patch is not rendered here")
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value, where)
        else:
            into[key] = copy.deepcopy(value)


def _generate_secret(directory: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """kustomize's secretGenerator for files, with a fixed name (a hashed name would need its references rewritten)."""
    options = spec.get("options", {})
    if set(spec) - {"name", "files", "options"} or set(options) - {"disableNameSuffixHash", "labels"} \
            or options.get("disableNameSuffixHash") is not True:
        raise KustomizeError(f"{directory}: secretGenerator {spec.get('name')}: only files with disableNameSuffixHash")
    data = {}
    for entry in spec["files"]:
        key, _, path = entry.rpartition("=") if "=" in entry else (Path(entry).name, "", entry)
        data[key] = base64.b64encode((directory / path).read_bytes()).decode()
    metadata: dict[str, Any] = {"name": spec["name"]}
    if options.get("labels"):
        metadata["labels"] = dict(options["labels"])
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque", "data": data}


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template's spec of a workload object, else None."""
    if doc.get("kind") not in WORKLOAD_KINDS:
        return None
    return doc["spec"]["template"]["spec"]


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The init containers and containers of a workload's pod template (none for other kinds)."""
    spec = pod_spec(doc)
    if spec is None:
        return []
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _set_image(container: dict[str, Any], image: dict[str, str]) -> None:
    """kustomize's images transformer for one container: match the name without its tag or digest."""
    current = container["image"]
    name, tag = current, ""
    if "@" in current:
        name, tag = current.split("@", 1)
        tag = "@" + tag
    elif ":" in current.rsplit("/", 1)[-1]:
        name, tag = current.rsplit(":", 1)
        tag = ":" + tag
    if name != image["name"]:
        return
    name = image.get("newName", name)
    if "newTag" in image:
        tag = ":" + str(image["newTag"])
    if "digest" in image:
        tag = "@" + image["digest"]
    container["image"] = name + tag
