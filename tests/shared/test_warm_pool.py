"""The warm pool's shared schema: the node state hash round-trips, keep_alive parses as Ollama's."""

from __future__ import annotations

import pytest

from shared.warm_pool import LOADING, READY, ModelSlot, NodeState, parse_keep_alive


def test_node_state_round_trips_through_its_hash() -> None:
    state = NodeState(node_id="n1", heartbeat=12.5, max_loaded=2, memory_budget=1 << 30,
                      catalogue={"a": "smollm2-135m", "b": "/m/b.gguf"},
                      models={"a": ModelSlot(state=READY, replicas=1, memory=5, last_used=3.0),
                              "b": ModelSlot(state=LOADING, memory=7, pinned=True)})
    fields = {k.encode(): v.encode() for k, v in state.to_hash().items()}
    assert NodeState.from_hash("n1", fields) == state


def test_a_malformed_node_hash_is_none() -> None:
    assert NodeState.from_hash("n1", {}) is None
    assert NodeState.from_hash("n1", {b"heartbeat": b"1", b"max_loaded": b"1", b"memory_budget": b"1",
                                      b"catalogue": b"[1]", b"models": b"{}"}) is None
    assert NodeState.from_hash("n1", {b"heartbeat": b"x", b"max_loaded": b"1", b"memory_budget": b"1",
                                      b"catalogue": b"{}", b"models": b"{}"}) is None


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), (0, 0.0), (30, 30.0), (2.5, 2.5), ("5m", 300.0), ("1h", 3600.0), ("30s", 30.0), ("500ms", 0.5),
    ("10", 10.0), (-1, -1.0), ("-5m", -1.0)])
def test_keep_alive_reads_as_ollama(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", [True, "soon", "5 minutes", [1], {"s": 1}, float("nan"), "1d"])
def test_a_bad_keep_alive_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        parse_keep_alive(value)
