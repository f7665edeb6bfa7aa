"""The gateway's floors (docs/architecture.md, "The gateway's floors"): each folder of gateway/ imports only its
own folder and the floors below it (and shared/, below everything), so a lower floor never learns of a higher one.
The APIs share one floor and import none of each other: what two of them need lives in replies/ below them.

batches/ and gateway/: batches/ is a floor of its own between the gateway's floors and its top. Its runner runs a
batch's lines through the gateway's Broker and serving base, and its routes read bodies with http/'s fields, so it
imports the gateway's floors; the gateway imports batches/ only at its top (app.py mounts batches' routes and
builds its Redis client with batches/redis_clients.py), never from a floor, and batches/ never imports that top."""

from __future__ import annotations

from pathlib import Path

from tests.support.import_graph import import_graph

ROOT = Path(__file__).resolve().parents[2]

# floors, lowest first: a module may import its own folder and any folder on a floor below its own
FLOORS: list[set[str]] = [
    {"gateway.http"},  # requests and answers: bodies' fields, errors' JSON, keys, limits, SSE, tracing
    {"gateway.cluster"},  # Redis: the broker, placement, the registry, streams, the warm pool, metrics
    {"gateway.replies"},  # the serving base every API shares: the common request, jobs, collecting, streaming
    {"gateway.openai", "gateway.anthropic", "gateway.ollama", "gateway.llamacpp", "gateway.responses_api"},  # APIs
    {"gateway.admin"},  # health, readiness, metrics, the dashboard, model and adapter routes, /openapi.json
    {"batches"},  # the Batch API's files, store, queue and runner (see the docstring)
    {"gateway"},  # the top: gateway/app.py and gateway/__main__.py build the app from every floor
]


def _folder(module: str) -> str | None:
    """The floor folder a module of gateway/ or batches/ lives in ('gateway' for the top); None elsewhere."""
    parts = module.split(".")
    if parts[0] == "batches":
        return "batches"
    if parts[0] != "gateway":
        return None
    folder = ".".join(parts[:2])
    return folder if any(folder in floor for floor in FLOORS) else "gateway"  # gateway.app, gateway.__main__


def _floor(folder: str) -> int:
    return next(level for level, floor in enumerate(FLOORS) if folder in floor)


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module of gateway/ or batches/ to another folder not on a floor below: 'a -> b'."""
    found = []
    for module, imported in sorted(graph.items()):
        folder = _folder(module)
        if folder is None:
            continue
        for name in sorted(imported):
            other = _folder(name)
            if other is None or other == folder:
                continue
            if _floor(other) >= _floor(folder):
                found.append(f"{module} -> {name}")
    return found


def test_each_floor_imports_only_its_own_folder_and_the_floors_below() -> None:
    assert floor_violations(import_graph()) == []


def test_every_folder_of_the_gateway_is_on_a_floor() -> None:
    folders = {f"gateway.{p.parent.name}" for p in (ROOT / "gateway").glob("*/__init__.py")}
    named = set().union(*FLOORS) - {"gateway", "batches"}
    assert folders == named


def test_the_floor_check_finds_imports_upwards_sideways_and_between_batches_and_the_gateway() -> None:
    graph = {
        "gateway.http.errors": {"gateway.anthropic.errors", "shared.errors"},
        "gateway.replies.serving": {"gateway.cluster.broker", "gateway.http.fields"},
        "gateway.ollama.serving": {"gateway.openai.serving", "gateway.replies.serving"},
        "gateway.openai.batches": {"batches.store"},
        "batches.runner": {"gateway.cluster.broker", "gateway.app"},
        "gateway.app": {"batches.routes", "gateway.admin.router"},
    }
    assert floor_violations(graph) == ["batches.runner -> gateway.app",
                                       "gateway.http.errors -> gateway.anthropic.errors",
                                       "gateway.ollama.serving -> gateway.openai.serving",
                                       "gateway.openai.batches -> batches.store"]
