"""The configuration reference is generated from shared/settings.py and documents every variable, both ways:
a setting without a row fails, and so does a row, a CLI help or a docs page naming a variable nothing reads."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from llmfleet.cli import build_parser
from shared.settings import ENV, Settings, SettingsError, allowed, doc
from shared.settings_reference import COMMAND, OTHERS, REFERENCE_PATH, Other, render

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"\b(?:LLMFLEET_[A-Z0-9_]*[A-Z0-9]|REDIS_URL)\b")
PRODUCT = ("gateway", "worker", "shared", "llmfleet", "batches", "deploy", "docker-compose.yml", "Dockerfile")
DOCUMENTED = set(ENV.values()) | {other.variable for other in OTHERS}


def _tracked(*paths: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in listed.stdout.splitlines() if (ROOT / line).is_file()]


def _reference_rows() -> list[str]:
    text = (ROOT / REFERENCE_PATH).read_text()
    return re.findall(r"^\| `([A-Z0-9_]+)` \|", text, flags=re.MULTILINE)


def test_every_setting_says_what_it_means() -> None:
    blank = [f.name for f in dataclasses.fields(Settings) if len(f.metadata.get("doc", "").strip()) < 10]
    assert blank == []


def test_the_committed_reference_is_what_the_generator_writes() -> None:
    assert (ROOT / REFERENCE_PATH).read_text() == render(), f"stale: run {COMMAND}"


def test_the_reference_has_one_row_per_variable_and_no_other() -> None:
    rows = _reference_rows()
    assert len(rows) == len(set(rows))
    assert set(rows) - DOCUMENTED == set(), "documented but read by nothing"
    assert DOCUMENTED - set(rows) == set(), "read but undocumented"


def test_every_variable_the_product_reads_is_documented() -> None:
    named = {name for path in _tracked(*PRODUCT) if path.suffix != ".gguf"
             for name in VARIABLE.findall(path.read_text(errors="replace"))}
    assert named, "the scan found no variable at all: its pattern or file list is wrong"
    assert named - DOCUMENTED == set()


@pytest.mark.parametrize("other", OTHERS, ids=lambda o: o.variable)
def test_each_variable_outside_settings_is_read_where_the_reference_says(other: Other) -> None:
    assert other.variable in (ROOT / other.read_by).read_text()


def test_the_docs_name_only_variables_that_exist() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    unknown = {f"{page.relative_to(ROOT)}: {name}" for page in pages
               for name in VARIABLE.findall(page.read_text()) if name not in DOCUMENTED}
    assert unknown == set()


def _outside(name: str) -> str | None:
    """A value just outside what `allowed(name)` says, or None where it accepts any text."""
    text = allowed(name)
    if text == "any text":
        return None
    if text.startswith("one of"):
        return "no-such-value"
    special = {"a URL starting": "http://host", "non-blank text": "   ", "1..65535": "65536", "host:port": "no-port",
               "> LLMFLEET_HEARTBEAT_INTERVAL_S": str(Settings().heartbeat_interval_s), "or auto": "-1"}
    for bound, value in (*special.items(), (">= 1", "0"), ("> 0", "0"), (">= 0", "-1")):
        if bound in text:
            return value
    raise AssertionError(f"{name}: no test value for {text!r}")


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Settings)])
def test_the_documented_range_is_the_one_enforced(name: str) -> None:
    outside = _outside(name)
    if outside is None:
        Settings.from_env({ENV[name]: "anything"})
        return
    with pytest.raises(SettingsError, match=ENV[name]):
        Settings.from_env({ENV[name]: outside})


def test_the_cli_help_prints_the_settings_text() -> None:
    """Every flag that sets a setting shows its meaning and variable (compared without whitespace: argparse wraps)."""
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in ("serve", "node", "gateway", "worker"):
        text = "".join(commands[command].format_help().split())
        dests = {action.dest for action in commands[command]._actions if action.dest in ENV}
        assert dests, command
        for dest in dests:
            assert "".join(doc(dest).split()) in text, (command, dest)
            assert ENV[dest] in text, (command, dest)
