"""A model file's facts for Ollama's /api/tags and /api/show: size, a digest cached beside the file (computed once,
recomputed when the file changes), details from the GGUF header, published by the heartbeat."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import fakeredis
import pytest

from shared import keys
from tests.support.tiny_gguf import write_tiny_gguf
from worker.engine.formats.gguf_file import tensor_elements
from worker.model_facts import (
    SIDECAR_SUFFIX,
    facts_json,
    file_digest,
    human_count,
    read_facts,
    read_facts_then_digest,
)
from worker.serve.heartbeat import Heartbeat


@pytest.fixture()
def gguf_file(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def test_the_facts_of_a_file(gguf_file: Path) -> None:
    facts = read_facts(gguf_file)
    assert facts.size == gguf_file.stat().st_size and facts.format == "gguf"
    assert facts.digest == hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    assert facts.family == "llama" and facts.model_info["general.architecture"] == "llama"
    assert facts.model_info["general.parameter_count"] == tensor_elements(gguf_file)
    assert facts.parameter_size == human_count(tensor_elements(gguf_file))
    assert facts.model_info["llama.context_length"] == 2048 and facts.model_info["llama.block_count"] == 2
    assert json.loads(facts_json(gguf_file) or "{}")["digest"] == facts.digest


def test_the_digest_is_computed_once_and_again_when_the_file_changes(gguf_file: Path) -> None:
    real = file_digest(gguf_file)
    sidecar = gguf_file.with_name(gguf_file.name + SIDECAR_SUFFIX)
    cached = json.loads(sidecar.read_text())
    assert cached["sha256"] == real and cached["size"] == gguf_file.stat().st_size
    sidecar.write_text(json.dumps({**cached, "sha256": "cafe"}))
    assert file_digest(gguf_file) == "cafe"  # read from beside the file, not hashed again
    stat = gguf_file.stat()
    os.utime(gguf_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file changed: hashed again
    assert file_digest(gguf_file) == real
    sidecar.write_text("not json")
    assert file_digest(gguf_file) == real


@pytest.mark.parametrize(("count", "text"), [(134_515_008, "134.52M"), (8_030_261_248, "8.0B"),
                                             (1_000_000_000, "1B"), (268_098_176, "268.10M"), (512, "512"),
                                             (22_713_216, "22.71M")])
def test_parameter_counts_print_as_ollama_prints_them(count: int, text: str) -> None:
    assert human_count(count) == text


def test_an_unreadable_file_has_no_facts(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 10)
    assert facts_json(broken) is None


def test_the_heartbeat_publishes_the_facts_once_known() -> None:
    client = fakeredis.FakeRedis()
    facts: list[str] = []
    beat = Heartbeat(client, worker_id="w1", model="m", slots=1, interval_s=1.0, ttl_s=3.0, gauges=dict,
                     held_jobs=list, facts=lambda: facts[0] if facts else None)
    beat.beat()
    assert client.hget(keys.MODEL_FACTS, "m") is None  # still reading the file
    facts.append('{"size": 7}')
    beat.beat()
    assert client.hget(keys.MODEL_FACTS, "m") == b'{"size": 7}'
    client.flushall()  # Redis restarted empty: the next beat writes them again
    beat.beat()
    assert client.hget(keys.MODEL_FACTS, "m") == b'{"size": 7}'


def test_an_encoder_can_only_embed(gguf_file: Path, minilm_f32_path: Path) -> None:
    assert read_facts(gguf_file).capabilities == ("completion", "tools")
    assert read_facts(minilm_f32_path).capabilities == ("embedding",)  # as Ollama's /api/show says of one


def test_the_header_facts_come_first_and_the_same_facts_again_with_the_digest(gguf_file: Path) -> None:
    kept: list[str | None] = []
    done = threading.Event()

    def keep(facts: str | None) -> None:
        kept.append(facts)
        if len(kept) == 2:
            done.set()

    read_facts_then_digest(gguf_file, None, keep)
    assert done.wait(10.0)
    first, second = (json.loads(facts or "{}") for facts in kept)
    assert first["digest"] == "" and second["digest"] == hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    assert {**first, "digest": second["digest"]} == second  # only the digest was added
