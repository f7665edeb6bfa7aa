"""Issue 42, instructor, unmodified, in TOOLS mode (chat completions) and RESPONSES_TOOLS mode (the Responses API)
against SmolLM2 workers: a forced tool at max_tokens 60 and 200 ends as a finished call that instructor parses
(it raised IncompleteOutputException when the forced call came back `length`). instructor pins an older openai
(and jiter) than the project's, so it runs from its own virtualenv, `.venv-instructor` (.ci/run makes it;
`LLMFLEET_INSTRUCTOR_PYTHON` names another interpreter), as a subprocess: tests/support/instructor_client.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_tools_api import MODEL

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "support" / "instructor_client.py"


def instructor_python() -> str:
    """The interpreter of instructor's own environment; skips the test with the reason when it has none."""
    python = Path(os.environ.get("LLMFLEET_INSTRUCTOR_PYTHON", ROOT / ".venv-instructor" / "bin" / "python"))
    if not python.exists():
        pytest.skip(f"no instructor environment at {python} (.ci/run makes it: python -m venv .venv-instructor "
                    "&& .venv-instructor/bin/pip install instructor)")
    return str(python)


@pytest.mark.parametrize("mode", ["TOOLS", "RESPONSES_TOOLS"])
@pytest.mark.parametrize("max_tokens", [60, 200])
def test_instructor_extracts_through_a_forced_tool(cluster: Any, mode: str, max_tokens: int) -> None:
    run = subprocess.run([instructor_python(), str(CLIENT), cluster.base_url, MODEL, mode, str(max_tokens)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    weather = json.loads(run.stdout)
    assert weather["unit"] in ("celsius", "fahrenheit") and isinstance(weather["city"], str)
