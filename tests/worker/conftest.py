"""Fixtures for worker tests: an Engine over the tiny random GGUF."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "engine"))

from tiny_gguf import write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory):
    """An Engine (model, tokenizer, template) over a tiny random-weight GGUF."""
    from worker.engine.engine import Engine

    return Engine.load(write_tiny_gguf(tmp_path_factory.mktemp("tiny-engine") / "tiny.gguf"))
