"""A node's catalogue: entries from flags and a file, unique ids, and the memory estimate of one worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet import catalogue
from llmfleet.catalogue import CatalogueError


def test_entries_name_their_model_or_take_its_served_name(tmp_path: Path) -> None:
    assert catalogue.parse_entry("smollm2-135m") == ("smollm2-135m", "smollm2-135m")
    assert catalogue.parse_entry("smollm2") == ("smollm2-135m", "smollm2")  # the alias's canonical id
    assert catalogue.parse_entry("/m/My-Model.Q4.gguf") == ("My-Model.Q4", "/m/My-Model.Q4.gguf")
    assert catalogue.parse_entry("chat=/m/x.gguf") == ("chat", "/m/x.gguf")
    assert catalogue.parse_entry("hf:o/r/f.gguf") == ("f", "hf:o/r/f.gguf")


def test_a_file_and_flags_make_one_catalogue(tmp_path: Path) -> None:
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"models": {"local": "weights/a.gguf", "small": "smollm2-135m"}}))
    built = catalogue.build(["other=/m/b.gguf"], str(path))
    assert built == {"local": str(tmp_path / "weights" / "a.gguf"), "small": "smollm2-135m", "other": "/m/b.gguf"}
    with pytest.raises(CatalogueError, match="given twice"):
        catalogue.build(["small=/m/c.gguf"], str(path))
    path.write_text("[1, 2]")
    with pytest.raises(CatalogueError, match="expected"):
        catalogue.build([], str(path))
    with pytest.raises(CatalogueError, match="cannot read"):
        catalogue.build([], str(tmp_path / "absent.json"))


def test_the_estimate_is_block_codes_and_float_tensors_plus_the_kv_pool(smollm2_gguf_path: Path,
                                                                         tmp_path: Path) -> None:
    kv = 32 * 2**20
    estimate = catalogue.estimate_bytes(str(smollm2_gguf_path), 32)
    # SmolLM2-135M Q4_1: 106,168,320 Q4_1 weights held as 4-bit codes (half a byte) with a float32 scale and offset
    # per 32 (0.25 bytes a weight), 28,311,552 Q8_0 as 8-bit ones with a float32 scale per 32 (its zero point is an
    # integer: 0.125), 35,136 F32 norm weights
    assert estimate - kv == 106_168_320 * 3 // 4 + 28_311_552 * 9 // 8 + 35_136 * 4
    assert catalogue.estimate_bytes("smollm2-135m", 32) == estimate  # a pulled alias: its cached file
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(smollm2_gguf_path.read_bytes()[:4096])
    assert catalogue.estimate_bytes(str(corrupt), 32) == 4096 + kv  # unreadable header: the file's size
    assert catalogue.estimate_bytes("hf:o/r/f.gguf", 32) == kv  # not here yet: the KV pool only
