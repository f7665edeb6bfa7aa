"""gateway.cluster.loras: naming adapters in requests (model suffix, llama.cpp's lora field) and resolving them."""

from __future__ import annotations

import pytest

from gateway.cluster.loras import adapters_of, parse_loras, resolve_job, split_model
from shared.errors import InvalidRequest, LoraNotFound
from shared.messages import GenerateJob, LoraRef
from shared.registry import RegistryEntry


def test_split_model() -> None:
    assert split_model("smollm2-135m:style-a") == ("smollm2-135m", "style-a")
    assert split_model("smollm2-135m") == ("smollm2-135m", None)
    assert split_model("hf:owner/repo/file.gguf") == ("hf:owner/repo/file.gguf", None)
    assert split_model(":style-a") == (":style-a", None)
    assert split_model("base:not/an/adapter") == ("base:not/an/adapter", None)


def test_parse_loras_reads_both_forms() -> None:
    assert parse_loras({}, None) == []
    assert parse_loras({}, "a") == [LoraRef(name="a", scale=1.0)]
    body = {"lora": [{"name": "b", "scale": 0.5}, {"id": 2, "scale": -1}, {"id": "c"}]}
    assert parse_loras(body, "a") == [LoraRef(name="a"), LoraRef(name="b", scale=0.5), LoraRef(name="#2", scale=-1.0),
                                      LoraRef(name="c")]


@pytest.mark.parametrize(("lora", "param"), [
    ({"name": "a", "scale": 4.5}, "lora[0].scale"),
    ({"name": "a", "scale": "1"}, "lora[0].scale"),
    ({"name": "a", "scale": float("nan")}, "lora[0].scale"),
    ({"id": -1}, "lora[0]"),
    ({"name": "has:colon"}, "lora[0]"),
    ({}, "lora[0]"),
    ("a", "lora[0]"),
])
def test_bad_lora_fields_are_400s_naming_the_field(lora: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_loras({"lora": [lora]}, None)
    assert info.value.param == param and info.value.status == 400
    with pytest.raises(InvalidRequest):
        parse_loras({"lora": {"name": "a"}}, None)
    with pytest.raises(InvalidRequest, match="at most 8"):
        parse_loras({"lora": [{"name": f"a{i}"} for i in range(9)]}, None)


def _worker(worker_id: str, model: str, loras: tuple[str, ...]) -> RegistryEntry:
    return RegistryEntry(worker_id=worker_id, model=model, slots=4, heartbeat=1.0, started=1.0, loras=loras)


def test_resolve_job_names_ids_and_404s_unknown_adapters() -> None:
    workers = [_worker("w1", "m", ("b", "a")), _worker("w2", "m", ("c",)), _worker("w3", "other", ("z",))]
    assert adapters_of("m", workers) == ["a", "b", "c"]
    job = GenerateJob(id="r", model="m", created=0, deadline=1, prompt="x",
                      loras=[LoraRef(name="#2", scale=0.5), LoraRef(name="a")])
    assert resolve_job(job, workers).loras == [LoraRef(name="c", scale=0.5), LoraRef(name="a")]
    plain = GenerateJob(id="r", model="m", created=0, deadline=1, prompt="x")
    assert resolve_job(plain, workers) is plain
    for ref, text in ((LoraRef(name="z"), "'z'"), (LoraRef(name="#3"), "id 3")):
        with pytest.raises(LoraNotFound, match=text) as info:
            resolve_job(GenerateJob(id="r", model="m", created=0, deadline=1, prompt="x", loras=[ref]), workers)
        assert info.value.status == 404 and info.value.code == "lora_not_found"


def test_registry_entry_round_trips_its_adapters() -> None:
    entry = _worker("w1", "m", ("a", "b"))
    fields = {k.encode(): str(v).encode() for k, v in entry.to_hash().items()}
    assert RegistryEntry.from_hash("w1", fields).loras == ("a", "b")
    fields[b"loras_version"] = b"7"
    assert RegistryEntry.from_hash("w1", fields).loras_version == 7
    del fields[b"loras"], fields[b"loras_version"]  # an entry written before adapters existed
    assert RegistryEntry.from_hash("w1", fields).loras == () and RegistryEntry.from_hash("w1", fields).loras_version == 0
