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


def test_registry_entry_round_trips_through_its_hash() -> None:
    from shared.registry import RegistryEntry

    entry = RegistryEntry(worker_id="w1", model="m", slots=4, heartbeat=100.5, started=99.0, load=2, served=7)
    fields = {k.encode(): str(v).encode() for k, v in entry.to_hash().items()}
    assert RegistryEntry.from_hash("w1", fields) == entry
    assert entry.is_live(now=101.0, ttl_s=10) and not entry.is_live(now=200.0, ttl_s=10)
    assert RegistryEntry.from_hash("w1", {b"model": b"m"}) is None  # no heartbeat, no version: not an entry
