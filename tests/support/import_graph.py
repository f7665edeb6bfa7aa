"""The import graph of our packages, read from the source (ast): every import statement in every file, at module
level, inside functions and under TYPE_CHECKING, relative imports resolved. One owner for the import checks of
tests/shared/test_boundaries.py (no circle), tests/worker/engine/test_wings.py (the engine's wings) and
tests/gateway/test_floors.py (the gateway's floors)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRAPH_PACKAGES = ("gateway", "worker", "shared", "llmfleet", "batches")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of GRAPH_PACKAGES (a package is its __init__.py)."""
    found = {}
    for package in GRAPH_PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every module name an import statement anywhere in the file names (module level, inside functions, under
    TYPE_CHECKING: each ties the two files together), relative imports resolved; `from a import b` yields a.b."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            yield from (f"{base}.{alias.name}" for alias in node.names)  # a.b, or a where b is not a module


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of our packages it imports (the nearest enclosing module of each imported name)."""
    files = module_files()
    graph: dict[str, set[str]] = {module: set() for module in files}
    for module, path in files.items():
        for name in imported_names(module, path):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].add(name)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(frozenset(component))
    return circles
