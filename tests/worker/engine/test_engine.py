"""Engine-level helpers: the decode-rate measurement a worker publishes for admission."""

from __future__ import annotations

from pathlib import Path

from worker.engine.engine import Engine


def test_measure_decode_rate_times_a_decode_step_of_any_width(tiny_gguf_path: Path) -> None:
    engine = Engine.load(tiny_gguf_path)
    rate = engine.measure_decode_rate(16)
    assert rate > 0.0
    assert engine.measure_decode_rate(0) > 0.0  # at least one row
