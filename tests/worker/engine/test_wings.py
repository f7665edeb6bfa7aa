"""The engine's wings and their order (docs/architecture.md, "The engine's wings"): each wing imports only the
wings below it, itself and errors.py, so none reaches the model layer on top (model.py, engine.py, ops.py,
forward_batch.py, lora.py, architectures/), and every folder of the engine is one of the wings named here."""

from __future__ import annotations

from pathlib import Path

from tests.support.import_graph import import_graph

ROOT = Path(__file__).resolve().parents[3]
ENGINE = "worker.engine"
EVERYONE_MAY_IMPORT = {f"{ENGINE}.errors"}  # the engine's one root of errors, importing nothing of the engine

# wing -> what else of the engine it may import: wings, or a module of the top named in full
BELOW = {
    "weights": set(),  # the quantized weight layouts held in memory (numpy)
    "kernels": {"weights"},  # the compiled numba kernels, over those layouts
    "formats": {"weights"},  # reading a GGUF file: metadata, config, tensors, the repack and derived caches
    "text": {"formats"},  # tokenizers, chat templates, tools, thinking, stops, constraints (the vocab's cache)
    "decode": {"text", "kernels"},  # sampling (its passes over whole rows compiled) and a request's generation state
    "kv": {"kernels", "formats", "ops"},  # the KV pool, its blocks and host tier, the recurrent state
}
MODEL_LAYER_FOLDERS = {"architectures"}  # the top: free to import every wing


def _wing(module: str) -> str | None:
    """The wing a module of the engine lives in; None for the top (a top-level module or architectures/)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[2] in BELOW else None


def wing_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a wing's module that reaches above its wing: 'module -> imported'."""
    found = []
    for module, imported in sorted(graph.items()):
        wing = _wing(module)
        if wing is None:
            continue
        allowed = {f"{ENGINE}.{below}" for below in BELOW[wing] | {wing}}
        for name in sorted(imported):
            if not name.startswith(f"{ENGINE}.") or name in EVERYONE_MAY_IMPORT:
                continue
            if not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed):
                found.append(f"{module} -> {name}")
    return found


def test_each_wing_imports_only_the_wings_below_it() -> None:
    assert wing_violations(import_graph()) == []


def test_errors_imports_nothing_of_the_engine() -> None:
    assert {name for name in import_graph()[f"{ENGINE}.errors"] if name.startswith(ENGINE)} == set()


def test_every_folder_of_the_engine_is_a_named_wing() -> None:
    folders = {p.parent.name for p in (ROOT / "worker" / "engine").glob("*/__init__.py")}
    assert folders == set(BELOW) | MODEL_LAYER_FOLDERS


def test_the_order_check_finds_an_import_upwards() -> None:
    graph = {
        f"{ENGINE}.kernels.simd": {f"{ENGINE}.weights.quant_blocks", f"{ENGINE}.errors"},
        f"{ENGINE}.formats.config": {f"{ENGINE}.kernels.simd", f"{ENGINE}.model"},
        f"{ENGINE}.model": {f"{ENGINE}.formats.config"},
    }
    assert wing_violations(graph) == [f"{ENGINE}.formats.config -> {ENGINE}.kernels.simd",
                                       f"{ENGINE}.formats.config -> {ENGINE}.model"]
