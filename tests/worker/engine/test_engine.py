"""Engine-level helpers: the decode-rate measurement a worker publishes for admission, remembered per machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.engine.engine import MEASURED_ROWS, Engine
from worker.engine.measured_rate import rate_file, remembered


def test_measure_decode_rate_times_a_decode_step_of_any_width(tiny_gguf_path: Path) -> None:
    engine = Engine.load(tiny_gguf_path)
    rate = engine.measure_decode_rate(16)
    assert rate > 0.0
    assert engine.measure_decode_rate(0) > 0.0  # at least one row


def test_the_measured_rate_is_remembered_beside_the_repack_cache(tiny_gguf_path: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFLEET_REPACK_DIR", str(tmp_path))
    engine = Engine.load(tiny_gguf_path)
    first = engine.measure_decode_rate(16)
    kept = rate_file(tiny_gguf_path, MEASURED_ROWS)
    assert kept is not None and kept.parent == tmp_path and remembered(kept) == pytest.approx(first * MEASURED_ROWS / 16)

    def measuring(rows: int) -> float:
        raise AssertionError("a remembered rate is not measured again")

    monkeypatch.setattr(engine, "_measure_step_rate", measuring)
    assert engine.measure_decode_rate(16) == pytest.approx(first)
    assert engine.measure_decode_rate(32) == pytest.approx(2 * first)  # scaled from the same 8-row step
    kept.write_text("{not json")  # unreadable: measured again
    monkeypatch.undo()
    monkeypatch.setenv("LLMFLEET_REPACK_DIR", str(tmp_path))
    assert engine.measure_decode_rate(8) > 0.0 and remembered(kept) is not None


def test_without_a_repack_directory_the_rate_is_measured_every_time(tiny_gguf_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFLEET_REPACK_DIR", "")
    assert rate_file(tiny_gguf_path, MEASURED_ROWS) is None
    assert Engine.load(tiny_gguf_path).measure_decode_rate(4) > 0.0
