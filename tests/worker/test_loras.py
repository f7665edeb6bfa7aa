"""worker.loras: a worker's adapters follow the desired set in Redis, within count and memory bounds."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis
import pytest

from shared import keys
from shared.errors import InvalidRequest, LoraNotFound
from shared.messages import LoraRef
from tests.support.lora_gguf import random_pairs, write_adapter
from tests.support.tiny_gguf import D_MODEL, N_HEADS, N_LAYERS
from worker.loras import AdapterSet

Q_SHAPE = {"attn_q": (D_MODEL, D_MODEL)}
assert D_MODEL // N_HEADS * N_HEADS == D_MODEL


@pytest.fixture()
def tiny_model(tiny_engine):
    return tiny_engine.model


@pytest.fixture()
def adapter_files(tmp_path: Path) -> dict[str, Path]:
    return {
        "a": write_adapter(tmp_path / "a.gguf", random_pairs(Q_SHAPE, N_LAYERS, 2, seed=1)),
        "b": write_adapter(tmp_path / "b.gguf", random_pairs(Q_SHAPE, N_LAYERS, 2, seed=2)),
        "bad": write_adapter(tmp_path / "bad.gguf", random_pairs({"attn_q": (D_MODEL, D_MODEL + 1)}, N_LAYERS, 2)),
    }


def _want(redis: fakeredis.FakeRedis, name: str, path: Path) -> None:
    redis.hset(keys.loras_desired("tiny"), name, json.dumps({"source": str(path), "added": 0}))


def test_sync_loads_unloads_and_reports_failures(tiny_model, adapter_files: dict[str, Path]) -> None:
    redis = fakeredis.FakeRedis()
    adapters = AdapterSet(tiny_model, "tiny", max_count=8, max_bytes=1 << 30)
    _want(redis, "a", adapter_files["a"])
    _want(redis, "bad", adapter_files["bad"])
    redis.incr(keys.loras_version("tiny"))
    assert adapters.snapshot() == (0, ())  # not synced yet
    adapters.sync(redis, force=True)
    assert adapters.names == ("a",)
    assert adapters.snapshot() == (1, ("a",))  # the version it followed, for the gateway's POST to wait on
    error = redis.hget(keys.loras_errors("tiny"), "bad").decode()
    assert "blk.0.attn_q.weight.lora_a has shape (2, 33)" in error
    assert redis.hkeys(keys.loras_desired("tiny")) == [b"a"]  # the failed name left the desired set
    held = adapters.resolve([LoraRef(name="a", scale=0.5)])
    redis.hdel(keys.loras_desired("tiny"), "a")
    adapters.sync(redis, force=True)
    assert adapters.names == ()
    assert held[0][0].layers[0]["qkv"].a.shape == (2, D_MODEL)  # a running request keeps its adapter


def test_resolve_syncs_once_then_404s(tiny_model, adapter_files: dict[str, Path]) -> None:
    redis = fakeredis.FakeRedis()
    adapters = AdapterSet(tiny_model, "tiny", max_count=8, max_bytes=1 << 30)
    _want(redis, "b", adapter_files["b"])  # added since the last sync: a job naming it loads it first
    ((adapter, scale),) = adapters.resolve([LoraRef(name="b", scale=2.0), LoraRef(name="b")], redis)
    assert adapter.name == "b" and scale == 2.0
    assert adapters.resolve([LoraRef(name="b", scale=0.0)], redis) == ()  # scale 0: not applied
    with pytest.raises(LoraNotFound, match="'nope'"):
        adapters.resolve([LoraRef(name="nope")], redis)
    with pytest.raises(InvalidRequest, match="outside"):
        adapters.resolve([LoraRef(name="b", scale=7.0)], redis)


def test_count_and_memory_bounds(tiny_model, adapter_files: dict[str, Path]) -> None:
    adapters = AdapterSet(tiny_model, "tiny", max_count=1, max_bytes=1 << 30)
    adapters.load("a", str(adapter_files["a"]))
    with pytest.raises(ValueError, match="LLMFLEET_MAX_LORAS"):
        adapters.load("b", str(adapter_files["b"]))
    adapters.load("a", str(adapter_files["b"]))  # replacing one by name is not a new one
    small = AdapterSet(tiny_model, "tiny", max_count=8, max_bytes=100)
    with pytest.raises(ValueError, match="LLMFLEET_LORA_MEMORY_MIB"):
        small.load("a", str(adapter_files["a"]))
    with pytest.raises(ValueError, match="adapter name"):
        small.load("a:b", str(adapter_files["a"]))


def test_scheduler_keys_the_prefix_cache_by_adapter_set(tiny_engine, tmp_path: Path) -> None:
    from tests.support.tiny_gguf import D_FF
    from worker.engine.decode.generation import GenerationParams
    from worker.engine.decode.sampling import SamplingParams
    from worker.schedule.scheduler import Scheduler, SchedulerConfig
    from worker.schedule.sequences import GenerationRequest, RequestDone, SequenceStep

    shapes = {"attn_v": (D_MODEL // N_HEADS * 2, D_MODEL), "ffn_down": (D_MODEL, D_FF)}
    path = write_adapter(tmp_path / "strong.gguf", random_pairs(shapes, N_LAYERS, 4, seed=5, scale=0.5))
    adapter = tiny_engine.model.load_adapter(path, "strong")
    sched = Scheduler(tiny_engine, SchedulerConfig())
    params = GenerationParams(max_tokens=8, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    prompt = list(range(3, 60))

    def run(rid: str, loras: tuple) -> tuple[list[int], int]:
        sched.add(GenerationRequest(rid, prompt, params, loras=loras))
        tokens, cached = [], -1
        while sched.has_work:
            for event in sched.step():
                if isinstance(event, SequenceStep):
                    tokens.append(event.output.token_id)
                elif isinstance(event, RequestDone):
                    cached = event.cached_tokens
        return tokens, cached

    base_tokens, _ = run("base", ())
    first, first_cached = run("lora-1", ((adapter, 1.0),))
    second, second_cached = run("lora-2", ((adapter, 1.0),))
    _, half_cached = run("lora-half", ((adapter, 0.5),))
    assert first != base_tokens  # the adapter changes the output
    assert first_cached == 0 and half_cached == 0  # another adapter set never reuses the base's (or each other's) KV
    assert second_cached > 0 and second == first  # the same set reuses its own
