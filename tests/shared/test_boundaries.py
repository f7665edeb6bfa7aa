"""Package boundaries: shared/ pulls in no Redis client or numpy; gateway/ no numpy, tokenizers or gguf; the engine
no Redis, Starlette or shared/; and no import circle between the files of our packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.import_graph import import_circles, import_graph, imported_names

ROOT = Path(__file__).resolve().parents[2]


def _modules_after_import(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_shared_imports_no_redis_and_no_numpy() -> None:
    loaded = _modules_after_import("import shared.codec, shared.errors, shared.keys, shared.messages, shared.settings, "
                                   "shared.redis_commands, shared.redis_sockets, shared.registry, shared.warm_pool, "
                                   "shared.warm_pool_commands")
    assert not loaded & {"redis", "numpy", "starlette", "gateway", "worker"}


def test_gateway_imports_no_numpy_tokenizers_or_gguf() -> None:
    loaded = _modules_after_import("import gateway.app, gateway.__main__")
    assert not loaded & {"numpy", "tokenizers", "gguf", "worker"}


def test_no_pickle_in_our_sources() -> None:
    for package in ("shared", "gateway"):
        for path in (ROOT / package).rglob("*.py"):
            assert "pickle" not in path.read_text(), path


# --- the import graph of our packages (tests/support/import_graph.py): no circle between files ----------------

# Circles allowed to remain: none (issue 24 broke the last ones). Add one only with a reason beside it.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def _describe(circle: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(circle) for b in sorted(graph[a] & circle)]
    return "{" + ", ".join(sorted(circle)) + "}: " + "; ".join(edges)


def test_no_import_circle_between_files() -> None:
    graph = import_graph()
    new = [c for c in import_circles(graph) if not any(c <= known for known in KNOWN_CIRCLES)]
    assert not new, "import circles:\n" + "\n".join(_describe(c, graph) for c in new)


def test_the_circle_finder_finds_circles_and_resolves_imports_to_files(tmp_path: Path) -> None:
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    assert import_circles({"a": {"b"}, "b": set()}) == []
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.first import x\n")
    (package / "first.py").write_text("from . import second\nfrom .second import y\nx = 1\n")
    (package / "second.py").write_text("def f():\n    from pkg import first\n    import pkg.first as again\n")
    assert sorted(imported_names("pkg.first", package / "first.py")) == ["pkg.second", "pkg.second.y"]
    assert sorted(imported_names("pkg", package / "__init__.py")) == ["pkg.first.x"]
    assert sorted(imported_names("pkg.second", package / "second.py")) == ["pkg.first", "pkg.first"]


def test_the_engine_imports_no_redis_starlette_shared_or_the_rest_of_the_worker() -> None:
    forbidden = ("redis", "starlette", "shared", "gateway", "llmfleet", "batches", "uvicorn", "msgpack")
    for path in (ROOT / "worker" / "engine").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for name in imported_names(module, path):
            top = name.split(".")[0]
            assert top not in forbidden, f"{path.relative_to(ROOT)} imports {name}"
            assert top != "worker" or name.startswith("worker.engine"), f"{path.relative_to(ROOT)} imports {name}"


def test_the_engine_loads_no_redis_starlette_or_shared() -> None:
    loaded = _modules_after_import("import worker.engine.engine")
    assert not loaded & {"redis", "starlette", "shared", "gateway"}
