"""A model larger than the memory available is refused at load, naming what it needs and what is free, before any
tensor is decoded; what the engine holds is counted from the header as the held forms take it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_gguf import write_tiny_gguf
from worker.engine.errors import ModelLoadError
from worker.engine.formats import load_budget
from worker.engine.formats.gguf_file import tensor_elements_by_type
from worker.engine.model import Model


def test_a_model_larger_than_available_memory_is_refused_with_the_numbers(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    need = load_budget.weights_bytes(path)
    monkeypatch.setattr(load_budget, "available_bytes", lambda: need - 1)
    decoded: list[str] = []
    monkeypatch.setattr("worker.engine.model.read_gguf", lambda *a, **k: decoded.append("read") or None)
    with pytest.raises(ModelLoadError, match=r"its weights need 0\.0 GiB .* 0\.0 GiB is available"):
        Model.from_file(path, repack_dir=None)
    assert decoded == []  # refused from the header, before the tensors were read


def test_a_model_that_fits_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(load_budget, "available_bytes", lambda: load_budget.weights_bytes(path))
    assert Model.from_file(path, repack_dir=None).config.n_layers > 0


def test_weights_bytes_counts_held_forms_and_float32(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    counts = tensor_elements_by_type(path)
    assert set(counts) == {"Q8_0", "F32"}
    assert load_budget.weights_bytes(path) == counts["Q8_0"] * 9 // 8 + 4 * counts["F32"]  # Q8_0: 1.125 bytes
