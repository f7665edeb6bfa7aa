"""A model whose matrices are all MXFP4 (the tiny llama-style file's, re-quantized) loads them in MXFP4's own form
(embedding, fused projections and output alike), gives logits close to its dequantized float32 path, and a row's
logits do not depend on the rest of its step."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize

from tests.support.tiny_gguf import write_tiny_gguf
from worker.engine.forward_batch import BatchEntry
from worker.engine.kv.pool import KVPool
from worker.engine.model import Model
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4
from worker.engine.weights.quantized import QuantizedLinear


def mxfp4_copy(source: Path, target: Path) -> Path:
    """`source` with every matrix (rows of a multiple of 32 weights) re-quantized to MXFP4."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(target), str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        dense = dequantize(np.asarray(tensor.data), tensor.tensor_type)  # float32, (rows, cols) for a matrix
        if dense.ndim == 2 and dense.shape[1] % 32 == 0:
            writer.add_tensor(tensor.name, quantize(dense, gguf.GGMLQuantizationType.MXFP4),
                              raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(tensor.name, np.ascontiguousarray(dense, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def quantized_forms(node: Any) -> list[type]:
    """The form of every QuantizedLinear inside the weights."""
    if isinstance(node, QuantizedLinear):
        return [type(node.blocks)]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return [t for f in dataclasses.fields(node) for t in quantized_forms(getattr(node, f.name))]
    if isinstance(node, (tuple, list)):
        return [t for item in node for t in quantized_forms(item)]
    return []


@pytest.fixture(scope="module")
def mxfp4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's file with MXFP4 matrices."""
    directory = tmp_path_factory.mktemp("mxfp4")
    return mxfp4_copy(write_tiny_gguf(directory / "tiny.gguf"), directory / "tiny-mxfp4.gguf")


def logits(model: Model, prompts: list[np.ndarray]) -> list[np.ndarray]:
    """Every position's logits of each prompt, all in one step: (T, V) each."""
    pool = KVPool(model.config, 96, 8, enable_prefix_caching=False)
    entries = []
    for seq_id, tokens in enumerate(prompts):
        pool.ensure(seq_id, len(tokens))
        entries.append(BatchEntry(seq_id, tokens, 0, "all"))
    return model.forward(entries, pool)


def test_an_mxfp4_model_runs_in_its_form_close_to_float32(mxfp4_path: Path) -> None:
    model = Model.from_file(mxfp4_path, repack_dir=None)
    forms = quantized_forms(model.weights)
    assert forms and set(forms) == {InterleavedMXFP4}
    reference = Model.from_file(mxfp4_path, block_codes=False)
    rng = np.random.default_rng(1)
    prompt, other = rng.integers(0, model.config.vocab_size, 12), rng.integers(0, model.config.vocab_size, 5)
    alone = logits(model, [prompt])[0]  # (12, V)
    exact = logits(reference, [prompt])[0]  # (12, V)
    assert np.abs(alone - exact).max() <= 0.01 * np.abs(exact).max()
    np.testing.assert_array_equal(logits(model, [other, prompt])[1], alone)
