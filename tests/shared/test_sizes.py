"""Modules and functions stay small: no module of the product over MAX_MODULE_LINES, no function over
MAX_FUNCTION_LINES apart from the compiled kernels (a numba kernel is one loop nest the compiler sees whole; a
factory is measured without the kernel it returns)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "worker", "shared", "llmfleet", "batches")
MAX_FUNCTION_LINES = 40
MAX_MODULE_LINES = 400


def _compiled(node: ast.AST) -> bool:
    """Whether a function is a numba kernel (decorated with njit, or numba's vectorize)."""
    decorators = getattr(node, "decorator_list", [])
    return any("njit" in ast.unparse(d) or "vectorize" in ast.unparse(d) for d in decorators)


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function, less those of the compiled kernels defined inside it."""
    inner = sum(child.end_lineno - child.lineno + 1 for child in ast.walk(node)
                if child is not node and isinstance(child, ast.FunctionDef) and _compiled(child))
    return node.end_lineno - node.lineno + 1 - inner


def _long_functions() -> dict[str, int]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _compiled(node)
                if function and (lines := _length(node)) > MAX_FUNCTION_LINES:
                    found[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    return found


def test_no_module_is_over_the_limit() -> None:
    sizes = {str(path.relative_to(ROOT)): path.read_text().count("\n")
             for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_function_outside_the_compiled_kernels_is_over_the_limit() -> None:
    assert _long_functions() == {}


def test_the_rule_sees_a_long_function_and_leaves_a_kernel_factory_its_own_lines() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    kernel = "\n".join(f"    {line}" for line in body.splitlines())
    tree = ast.parse(f"def long():\n{body}\n\ndef factory():\n    @njit\n    def kernel():\n{kernel}\n    return kernel\n")
    long_function, factory = tree.body
    assert _length(long_function) == MAX_FUNCTION_LINES + 1
    assert _length(factory) == 3
