"""The README stays a front door and the docs site stays true: it builds strictly (no broken link, no page left out
of the navigation), and what its pages claim about the tree (model tables, which benchmarks import tests/) holds."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 250


def _table(marker: str) -> str:
    """The README table that starts after the `<!-- {marker} table` comment."""
    text = README.read_text()
    start = text.index(f"<!-- {marker} table")
    return text[start:text.index("<!-- end of the", start)]


def _first_column(table: str) -> set[str]:
    return {name for row in re.findall(r"^\| (.+?) \|", table, flags=re.MULTILINE)
            for name in re.findall(r"`([\w.:-]+)`", row)}


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES
    for command in ("pip install -e '.[dev]'", "llmfleet serve", "python -m pytest", 'pytest -m "not slow"'):
        assert command in README.read_text(), command


def test_every_readme_link_into_docs_exists() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text())
    assert links
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_model_table_lists_every_known_alias() -> None:
    from worker.models import KNOWN_MODELS

    named = _first_column(_table("model"))
    rows = {alias for alias in KNOWN_MODELS if alias in named or alias.removesuffix("-f16") in named}
    assert rows == set(KNOWN_MODELS)
    assert {name for name in named if not name.startswith((":", "-"))} <= set(KNOWN_MODELS)


def test_the_architecture_table_lists_exactly_the_engine_architectures() -> None:
    from worker.engine.architectures import ARCHITECTURES

    assert _first_column(_table("architecture")) == set(ARCHITECTURES)


def test_only_the_benchmarks_the_testing_page_names_import_tests() -> None:
    importing = set()
    for path in (ROOT / "bench").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [module or ""]
            if any(name == "tests" or name.startswith("tests.") for name in names):
                importing.add(f"bench/{path.name}")
    page = (ROOT / "docs" / "testing.md").read_text()
    claimed = set(re.findall(r"`(bench/\w+\.py)[^`]*` imports\s+`tests/", page))
    assert importing == claimed


def test_every_docs_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert {page for page in pages if f": {page}" not in nav} == set()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs or its Material theme is not installed (pip install -e '.[dev]' brings mkdocs-material)")
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_the_honour_table_names_every_key_each_architecture_reads() -> None:
    from worker.engine.architectures import ARCHITECTURES
    from worker.engine.formats.file_fields import DECODER_KEYS

    text = (ROOT / "docs" / "models.md").read_text()
    rows: dict[str, str] = {}
    for line in text.splitlines():  # the honour table comes first; later tables reuse family names
        if line.startswith("| ") and "keys read" not in line:
            rows.setdefault(line.split("|")[1].strip().strip("`"), line)
    assert all(f"`{key}`" in rows["every decoder"] for key in DECODER_KEYS)
    for name, architecture in ARCHITECTURES.items():
        if name == "bert":
            continue
        assert name in rows, name
        assert all(f"`{key}`" in rows[name] for key in architecture.metadata_keys - DECODER_KEYS), name
