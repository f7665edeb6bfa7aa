"""The gateway's layout as docs/architecture.md describes it: folders that follow a request, and every file the
README, the architecture page's folders and newcomer's walk, and the other docs pages name exists where they say
(module and function sizes: tests/shared/test_sizes.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"
TOP_LEVEL = {"__init__.py", "__main__.py", "app.py"}  # everything else lives in a folder
PATH = re.compile(r"(?<![\w/])((?:gateway|worker|shared)/[\w/]+(?:\.py|/))")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _walk() -> str:
    page = ARCHITECTURE.read_text()
    start = page.index("**A newcomer's walk**")
    return page[start:page.index("\n\n", start)]


def _pages() -> list[Path]:
    """The README and every docs page: wherever a gateway file is named."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_gateway_has_only_the_factory_at_its_top() -> None:
    assert {p.name for p in GATEWAY.glob("*.py")} == TOP_LEVEL


def test_the_docs_name_only_gateway_files_that_exist() -> None:
    assert ARCHITECTURE in _pages()
    named = {path for page in _pages() for path in PATH.findall(page.read_text())}
    assert any(p.startswith("gateway/") for p in PATH.findall(ARCHITECTURE.read_text()))
    missing = sorted(p for p in named if p.startswith("gateway/") and not (ROOT / p).exists())
    assert missing == []


def test_the_newcomers_walk_names_real_files_in_request_order() -> None:
    walk = _walk()
    named = PATH.findall(walk)
    assert [p for p in named if not (ROOT / p).exists()] == []
    order = [p for p in named if p.startswith("gateway/")]
    first = {p: order.index(p) for p in order}
    assert first["gateway/http/middleware.py"] < first["gateway/openai/router.py"] \
        < first["gateway/replies/protocol.py"] < first["gateway/replies/serving.py"] \
        < first["gateway/cluster/broker.py"] < first["gateway/cluster/subscriber.py"] < first["gateway/http/sse.py"]


def test_the_walk_starts_where_the_app_mounts_the_route() -> None:
    """The router the walk names is the one app.py mounts for /v1/chat/completions."""
    tree = ast.parse((GATEWAY / "openai" / "router.py").read_text())
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.AsyncFunctionDef)}
    assert "chat_completions" in names
    assert "gateway.openai.router" in (GATEWAY / "app.py").read_text()
