"""Fixtures for engine tests: a tiny random GGUF written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a tiny random-weight llama GGUF with a byte-level tokenizer."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_gguf_path: Path):
    """The tiny model loaded (shared, read-only)."""
    from worker.engine.model import Model

    return Model.from_file(tiny_gguf_path)
