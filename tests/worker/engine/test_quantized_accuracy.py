"""The served path (every quantized type: integer kernels against int8 activations; K-quants in their own form,
Q4_0..Q8_0 interleaved) against the float32 references, teacher-forced, within
llama.cpp's own error on the same files, as ../shared/fixtures/quantized/README.md says; the loaded model holds
no float32 copy of a quantized tensor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.repack_dir import mapped_from_file
from worker.engine.forward_batch import BatchEntry
from worker.engine.model import Model
from worker.engine.weights.interleaved_blocks import InterleavedBlocks
from worker.engine.weights.quantized import QuantizedLinear

FIXTURES = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures"
SYNTHETIC_1B = Path.home() / ".cache" / "llmfleet-peers" / "models" / "synthetic-llama-1b-Q4_K_M.gguf"
STEPS = 32  # the quantized fixtures cover each prompt's first 32 steps


def budget(name: str, model_fixtures: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """llama.cpp's error summary on a quantized file and the float32 reference it was measured against (in
    quantized/, or in the model's own fixture folder when `model_fixtures` names it)."""
    path = FIXTURES / "quantized" / name
    if not path.is_file():
        pytest.skip(f"fixture absent: {path}")
    errors = json.loads(path.read_text())
    reference = (FIXTURES / model_fixtures if model_fixtures else path.parent) / errors["float32_reference"]
    return errors["summary"], json.loads(reference.read_text())


def errors_of(model: Model, reference: dict[str, Any], batch: bool) -> list[float]:
    """Per teacher-forced step, the largest |logit - float32 logit| over the reference's top-5 ids; decode one
    token at a time after the prompt, or (batch) prompt and continuation in one forward (the tiled path)."""
    out = []
    for case in reference["greedy"]:
        prompt, greedy = list(case["prompt_ids"]), list(case["greedy_ids"])[:STEPS]
        tokens = prompt + greedy[:-1]
        pool = model.new_pool((len(tokens) + 64) * model.config.kv_bytes_per_token, enable_prefix_caching=False)
        pool.ensure(0, len(tokens))
        if batch:
            rows = model.forward([BatchEntry(0, np.array(tokens), 0, output="all")], pool)[0][len(prompt) - 1 :]
        else:
            rows = [model.forward([BatchEntry(0, np.array(prompt), 0)], pool)[0]]  # (V,)
            for i, token in enumerate(greedy[:-1]):
                rows.append(model.forward([BatchEntry(0, np.array([token]), len(prompt) + i)], pool)[0])  # (V,)
        for row, top5 in zip(rows, case["top5_per_step"][:STEPS]):
            ids = [entry[0] for entry in top5]
            out.append(float(np.max(np.abs(np.asarray(row)[ids] - np.array([entry[1] for entry in top5])))))
    return out


def check_within_budget(model: Model, fixture: str, batch: bool, model_fixtures: str = "") -> None:
    """Our max and mean step error no larger than llama.cpp's decode figures (printed beside them)."""
    summary, reference = budget(fixture, model_fixtures)
    errs = errors_of(model, reference, batch)
    mine_max, mine_mean = max(errs), float(np.mean(errs))
    print(f"{fixture} {'batch' if batch else 'decode'}: ours max {mine_max:.4f} mean {mine_mean:.4f}; llama.cpp "
          f"decode max {summary['decode_max_abs_err']} mean {summary['decode_mean_abs_err']}")
    assert mine_max <= summary["decode_max_abs_err"] and mine_mean <= summary["decode_mean_abs_err"]


def float32_bytes(node: Any, seen: set[int]) -> int:
    """Bytes of float32 arrays in the weights outside QuantizedLinear tables (norms, biases, column scales)."""
    if id(node) in seen:
        return 0
    seen.add(id(node))
    if isinstance(node, QuantizedLinear):
        return 0
    if isinstance(node, np.ndarray):
        return node.nbytes if node.dtype == np.float32 else 0
    if isinstance(node, (tuple, list)):
        return sum(float32_bytes(item, seen) for item in node)
    if hasattr(node, "__dataclass_fields__"):
        return sum(float32_bytes(getattr(node, name), seen) for name in node.__dataclass_fields__)
    return 0


@pytest.mark.slow
@pytest.mark.parametrize("batch", [False, True])
def test_smollm2_q4_1_within_llama_cpp_error(smollm2_engine: Any, batch: bool) -> None:
    check_within_budget(smollm2_engine.model, "smollm2-q4_1-vs-f32.json", batch, "smollm2")


@pytest.mark.slow
@pytest.mark.parametrize("batch", [False, True])
def test_gemma3_q4_k_m_within_llama_cpp_error(gemma3_engine: Any, batch: bool) -> None:
    check_within_budget(gemma3_engine.model, "gemma3-q4_k_m-vs-f32.json", batch, "gemma3")


@pytest.mark.slow
def test_synthetic_1b_within_llama_cpp_error(tmp_path: Path) -> None:
    if not SYNTHETIC_1B.is_file():
        pytest.skip(f"synthetic 1B absent ({SYNTHETIC_1B}): ../shared/peers/make-synthetic-model.sh 1b makes it")
    model = Model.from_file(SYNTHETIC_1B)
    check_within_budget(model, "synthetic-1b-q4_k_m-vs-f32.json", batch=True)


@pytest.mark.slow
def test_no_float32_copy_of_a_quantized_tensor(smollm2_gguf_path: Path, tmp_path: Path) -> None:
    model = Model.from_file(smollm2_gguf_path, repack_dir=tmp_path)
    w, cfg = model.weights, model.config
    assert isinstance(w.token_embedding, QuantizedLinear) and w.output is w.token_embedding  # tied, one table
    for layer in w.layers:
        for matrix in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            assert isinstance(matrix, QuantizedLinear) and matrix.blocks.codes.dtype == np.uint8
            assert mapped_from_file(matrix.blocks.codes)  # a view of the read-only repack mapping
            assert isinstance(matrix.blocks, InterleavedBlocks) and matrix.blocks.nibbles  # Q4_1: two codes a byte
    assert float32_bytes(w, set()) < 64 * cfg.d_model * (cfg.n_layers + 2)  # norms, scales: no matrix
    codes = sum(m.blocks.codes.nbytes for layer in w.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up,
                                                                     layer.w_down))
    assert w.nbytes < 1.6 * (codes + w.token_embedding.blocks.codes.nbytes)  # codes + tables (0.5 x packed codes)
