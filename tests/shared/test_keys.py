"""Every key and channel lives under one prefix."""

from __future__ import annotations

from shared import keys


def test_names() -> None:
    assert keys.jobs_stream("m/x") == "llmfleet:{m/x}:jobs"
    assert keys.events_channel("m", "req-1") == "llmfleet:{m}:events:req-1"
    assert keys.journal_stream("m", "req-1") == "llmfleet:{m}:journal:req-1"
    assert keys.cancel_channel("m") == "llmfleet:{m}:cancel"
    assert keys.cancelled_marker("m", "req-1") == "llmfleet:{m}:cancelled:req-1"
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


KEY_LIKE = rf"{keys.PREFIX}[a-z]"  # "llmfleet:jobs..." (a key), not "llmfleet: usage ..." (a message)


def _key_patterns() -> dict[str, str]:
    """Every Redis name the key table builds, as a pattern: each builder called with its parameters' names as
    placeholders ("{model}"), each constant as it is; rq's own keys and field names left out."""
    import inspect

    patterns = {}
    for name, value in vars(keys).items():
        if name.startswith("_"):
            continue
        if inspect.isfunction(value) and value.__module__ == keys.__name__:
            signature = inspect.signature(value)
            if signature.return_annotation not in ("str", str):
                continue  # the list builders repeat a str builder's names
            patterns[name] = value(*[f"{{{p}}}" for p in signature.parameters])
        elif isinstance(value, str) and value.startswith(keys.PREFIX) and value != keys.PREFIX:
            patterns[name] = value
    return patterns


def _placeholders_blank(text: str) -> str:
    import re

    return re.sub(r"\{[a-z_]+\}", "{}", text)


def test_every_key_the_table_builds_is_documented_in_the_contract_and_the_module() -> None:
    """One key table: shared/keys.py builds every name, and both its docstring and CONTRACT.md describe each
    (placeholder names may differ: {id} and {request_id} both mean the request's id)."""
    from pathlib import Path

    contract = _placeholders_blank((Path(keys.__file__).parent / "CONTRACT.md").read_text())
    docstring = _placeholders_blank(keys.__doc__ or "")
    patterns = _key_patterns()
    assert len(patterns) > 30
    missing = [f"{where} lacks {pattern} (keys.{name})" for name, pattern in patterns.items()
               for where, text in (("CONTRACT.md", contract), ("keys.py's table", docstring))
               if _placeholders_blank(pattern) not in text]
    assert missing == []


def test_no_redis_name_is_built_outside_the_key_table() -> None:
    """Code outside shared/keys.py spells no key name (a string starting with the prefix and a name; messages
    such as "llmfleet: ..." and prose may)."""
    import ast
    import re
    from pathlib import Path

    root = Path(keys.__file__).parents[1]
    offenders = []
    for folder in ("gateway", "worker", "shared", "llmfleet", "batches"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == Path(keys.__file__):
                continue
            offenders += [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
                          if isinstance(node, ast.Constant) and isinstance(node.value, str)
                          and re.match(KEY_LIKE, node.value)]
    assert offenders == []


def _model_names(model: str, worker_id: str = "w1") -> list[str]:
    """Every name shared/keys.py builds from one model: its job path (streams of every class, per-worker streams,
    fair queues, placement, prefixes, dead letters, cancels) and the model's other state."""
    names = [*keys.jobs_streams(model), *keys.worker_jobs_streams(model, worker_id), keys.placed_workers(model),
             keys.prefix_owner(model, "abc123"), keys.cancel_channel(model), keys.deadletter_stream(model),
             keys.kv_tier_drop(model), keys.loras_desired(model), keys.loras_version(model),
             keys.loras_errors(model), keys.pool_loading(model), keys.pool_failed(model)]
    for priority in keys.PRIORITY_ORDER:
        names += keys.fair_keys(model, priority)
    return names


def test_every_name_of_a_model_hashes_to_one_cluster_slot() -> None:
    """Redis Cluster: the scripts and transactions over a model's keys (FAIR_SCRIPT, placement's XADD + SADD,
    stealing's FORGET_SCRIPT) stay in one slot, for model names with colons, slashes, dots and at signs."""
    from redis.crc import key_slot

    for model in ("smollm2-135m", "qwen3:0.6b", "org/model.Q4_K_M", "m@v2"):
        names = _model_names(model, worker_id="host-1:{odd}")
        slots = {key_slot(name.encode()) for name in names}
        assert len(slots) == 1, (model, sorted(slots))
        assert key_slot(keys.model_tag(model).encode()) in slots
    assert key_slot(keys.jobs_stream("a").encode()) != key_slot(keys.jobs_stream("b").encode())  # models spread


def test_every_builder_named_after_a_model_starts_with_its_tag() -> None:
    """No builder taking a model forgets the tag (a new key added without it would land in another slot)."""
    import inspect

    for name, value in vars(keys).items():
        if inspect.isfunction(value) and value.__module__ == keys.__name__ and "model" in inspect.signature(value).parameters:
            built = value(*["mdl" if p == "model" else "x" for p in inspect.signature(value).parameters])
            for key in built if isinstance(built, list) else [built]:
                assert key.startswith("llmfleet:{mdl}"), (name, key)
