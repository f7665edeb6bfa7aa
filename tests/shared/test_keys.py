"""Every key and channel lives under one prefix."""

from __future__ import annotations

from shared import keys


def test_names() -> None:
    assert keys.jobs_stream("m/x") == "llmfleet:jobs:m/x"
    assert keys.events_channel("req-1") == "llmfleet:events:req-1"
    assert keys.journal_stream("req-1") == "llmfleet:journal:req-1"
    assert keys.cancel_channel("m") == "llmfleet:cancel:m"
    assert keys.cancelled_marker("req-1") == "llmfleet:cancelled:req-1"
    assert keys.worker_key("w1") == "llmfleet:worker:w1"
    for name in (keys.WORKERS_INDEX, keys.MODELS_INDEX):
        assert name.startswith(keys.PREFIX)
