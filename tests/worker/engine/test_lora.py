"""LoRA adapters: llama.cpp parity on the real SmolLM2, mixed-adapter batches, prefix-cache keys, bad files.

The parity data (../shared/fixtures/smollm2-lora/reference.json) is checked exactly as the base model's:
teacher-forced, every reference logit within 0.05, argmax equal where the reference margin is above 0.05.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.lora_gguf import random_pairs, write_adapter
from tests.support.tiny_gguf import D_FF, D_MODEL, N_HEADS, N_KV_HEADS, N_LAYERS
from tests.worker.engine.test_reference_parity import check_step
from worker.engine.errors import ModelLoadError
from worker.engine.formats.gguf_file import read_gguf
from worker.engine.forward_batch import BatchEntry
from worker.engine.lora import AdapterLoadError, LoraAdapter, check_scale, lora_set_key
from worker.engine.model import Model

HEAD_DIM = D_MODEL // N_HEADS
TINY_SHAPES = {"attn_q": (N_HEADS * HEAD_DIM, D_MODEL), "attn_k": (N_KV_HEADS * HEAD_DIM, D_MODEL),
               "attn_v": (N_KV_HEADS * HEAD_DIM, D_MODEL), "attn_output": (D_MODEL, N_HEADS * HEAD_DIM),
               "ffn_gate": (D_FF, D_MODEL), "ffn_up": (D_FF, D_MODEL), "ffn_down": (D_MODEL, D_FF)}


@pytest.fixture(scope="module")
def lora_reference(lora_fixtures: Path) -> dict[str, Any]:
    """llama.cpp's numbers with the fixture adapters applied."""
    return json.loads((lora_fixtures / "reference.json").read_text())


@pytest.fixture(scope="module")
def smollm2_adapters(smollm2_engine: Any, lora_reference: dict, lora_fixtures: Path) -> dict[str, LoraAdapter]:
    """style-a and style-b loaded against the real SmolLM2."""
    model: Model = smollm2_engine.model
    return {name: model.load_adapter(lora_fixtures / spec["file"], name)
            for name, spec in lora_reference["adapters"].items()}


def _uses(case: dict, adapters: dict[str, LoraAdapter]) -> tuple[tuple[LoraAdapter, float], ...]:
    return tuple((adapters[a["name"]], float(a["scale"])) for a in case["adapters"])


@pytest.mark.slow
def test_every_adapter_set_matches_llama_cpp_teacher_forced(smollm2_engine: Any, lora_reference: dict,
                                                            smollm2_adapters: dict[str, LoraAdapter]) -> None:
    model: Model = smollm2_engine.model
    pool = model.new_pool(64 << 20, enable_prefix_caching=False)
    worst = 0.0
    assert {len(c["adapters"]) for c in lora_reference["cases"]} == {0, 1, 2}
    for sid, case in enumerate(lora_reference["cases"]):
        uses = _uses(case, smollm2_adapters)
        pool.ensure(sid, len(case["prompt_ids"]))
        logits = model.forward([BatchEntry(sid, np.array(case["prompt_ids"]), 0, loras=uses)], pool)[0]
        for step, greedy_id in enumerate(case["greedy_ids"]):
            worst = max(worst, check_step(logits, case["top5_per_step"][step], greedy_id,
                                          f"{case['adapters']} {case['prompt']!r} step {step}"))
            start = pool.blocks.num_tokens(sid)
            pool.extend(sid, 1)
            logits = model.forward([BatchEntry(sid, np.array([greedy_id]), start, loras=uses)], pool)[0]
        pool.blocks.free(sid)
    assert worst < 0.05


@pytest.mark.slow
def test_base_and_adapter_rows_share_one_batch(smollm2_engine: Any, lora_reference: dict,
                                               smollm2_adapters: dict[str, LoraAdapter]) -> None:
    """Base, style-a, style-b and both-adapter rows decode together, teacher-forced: each row gets its alone
    logits (and llama.cpp's), through mixed prefill + decode steps."""
    model: Model = smollm2_engine.model
    cases = [c for c in lora_reference["cases"] if c["prompt"] == lora_reference["cases"][0]["prompt"]]
    cases += [c for c in lora_reference["cases"] if c["prompt"].startswith("<|im_start|>")]
    assert len(cases) == 8
    uses = [_uses(c, smollm2_adapters) for c in cases]
    alone_pool = model.new_pool(32 << 20, enable_prefix_caching=False)
    alone = []  # per case: logits of every step, run alone
    for sid, (case, use) in enumerate(zip(cases, uses)):
        alone_pool.ensure(sid, len(case["prompt_ids"]))
        steps = [model.forward([BatchEntry(sid, np.array(case["prompt_ids"]), 0, loras=use)], alone_pool)[0]]
        for token in case["greedy_ids"][:5]:
            start = alone_pool.blocks.num_tokens(sid)
            alone_pool.extend(sid, 1)
            steps.append(model.forward([BatchEntry(sid, np.array([token]), start, loras=use)], alone_pool)[0])
        alone.append(steps)
    pool = model.new_pool(32 << 20, enable_prefix_caching=False)
    progress = [0] * len(cases)  # steps done per case; half the cases start one step late (prefill beside decodes)
    for step in range(7):
        entries, running = [], []
        for sid, (case, use) in enumerate(zip(cases, uses)):
            if step < sid % 2 or progress[sid] > 5:
                continue
            if progress[sid] == 0:
                pool.ensure(sid, len(case["prompt_ids"]))
                entries.append(BatchEntry(sid, np.array(case["prompt_ids"]), 0, loras=use))
            else:
                start = pool.blocks.num_tokens(sid)
                pool.extend(sid, 1)
                entries.append(BatchEntry(sid, np.array([case["greedy_ids"][progress[sid] - 1]]), start, loras=use))
            running.append(sid)
        for sid, logits in zip(running, model.forward(entries, pool)):
            case = cases[sid]
            # bit for bit: every kernel's reduction is fixed per row, and adapters add in one fixed order
            np.testing.assert_array_equal(logits, alone[sid][progress[sid]],
                                          err_msg=f"{case['adapters']} step {progress[sid]}")
            check_step(logits, case["top5_per_step"][progress[sid]], case["greedy_ids"][progress[sid]],
                       f"{case['adapters']} batched step {progress[sid]}")
            progress[sid] += 1
    assert progress == [6] * len(cases)
    # the adapters change the outputs: style-a's first logits differ from the base model's
    assert np.abs(alone[1][0] - alone[0][0]).max() > 0.5


def test_unmerged_adapter_equals_merged_weights(tiny_gguf_path: Path, tmp_path: Path) -> None:
    """W + s * alpha/r * B A merged into the file's tensors (before any load transform) gives the same logits
    as the adapter applied unmerged: the Q/K row order, query scale and folded norms are transformed right. (Both
    models compute in float32, so that only the adapter's placement can differ: the quantized base's int8
    activations would differ from the merged float32 weights' by more than the check's tolerance.)"""
    model = Model.from_file(tiny_gguf_path, block_codes=False)
    rank, alpha, scale = 4, 8.0, 0.7
    pairs = random_pairs(TINY_SHAPES, N_LAYERS, rank, seed=3, scale=0.3)
    adapter = model.load_adapter(write_adapter(tmp_path / "a.gguf", pairs, alpha=alpha), "a")
    merged = dict(read_gguf(tiny_gguf_path).tensors)
    for name in list(merged):
        if name + ".lora_a" in pairs:
            update = pairs[name + ".lora_b"] @ pairs[name + ".lora_a"]  # (out, in)
            merged[name] = merged[name] + np.float32(scale * alpha / rank) * update
    merged_model = Model(model.config, model.architecture,
                         model.architecture.load(merged, model.config, "merged"), model.metadata)
    tokens = np.array([5, 17, 33, 2, 90, 41, 7])
    outs = []
    for m, uses in ((model, ((adapter, scale),)), (merged_model, ()), (model, ())):
        pool = m.new_pool(1 << 20, enable_prefix_caching=False)
        pool.ensure(0, len(tokens))
        outs.append(m.forward([BatchEntry(0, tokens, 0, output="all", loras=uses)], pool)[0])
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    assert np.abs(outs[0] - outs[2]).max() > 1e-2  # and the adapter does change something


def test_prefix_cache_is_keyed_by_the_adapter_set(tiny_model: Model, tmp_path: Path) -> None:
    adapter = tiny_model.load_adapter(write_adapter(tmp_path / "a.gguf", random_pairs(TINY_SHAPES, N_LAYERS, 2)), "a")
    blocks = tiny_model.new_pool(1 << 20, block_size=4).blocks
    prompt = list(range(1, 14))
    blocks.allocate(0, prompt)
    blocks.commit(0, prompt)
    key = lora_set_key(((adapter, 1.0),))
    assert key is not None and key != lora_set_key(((adapter, 0.5),))
    assert lora_set_key(()) is None
    assert blocks.allocate(1, prompt, seed=key) == 0  # the base model's blocks are not the adapter's
    blocks.commit(1, prompt)
    assert blocks.allocate(2, prompt, seed=key) == 12  # the same adapter set hits its own blocks
    assert blocks.allocate(3, prompt) == 12  # and the base model still hits its own


def test_scale_bounds() -> None:
    assert check_scale(0.5) == 0.5 and check_scale(-4.0) == -4.0
    for bad in (4.01, -10, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="outside"):
            check_scale(bad)


@pytest.mark.parametrize(("tensors", "kwargs", "message"), [
    ({"blk.0.attn_q.weight.lora_a": np.zeros((2, 31)), "blk.0.attn_q.weight.lora_b": np.zeros((32, 2))}, {},
     r"tensor blk\.0\.attn_q\.weight\.lora_a has shape \(2, 31\), expected \(r, 32\)"),
    ({"blk.1.ffn_up.weight.lora_a": np.zeros((2, 32)), "blk.1.ffn_up.weight.lora_b": np.zeros((63, 2))}, {},
     r"tensor blk\.1\.ffn_up\.weight\.lora_b has shape \(63, 2\), expected \(64, 2\)"),
    ({"blk.5.attn_q.weight.lora_a": np.zeros((2, 32)), "blk.5.attn_q.weight.lora_b": np.zeros((32, 2))}, {},
     r"tensor blk\.5\.attn_q\.weight\.lora_a targets layer 5, the base model has 2"),
    ({"blk.0.attn_q.weight.lora_a": np.zeros((2, 32))}, {}, r"tensor blk\.0\.attn_q\.weight\.lora_b is missing"),
    ({"blk.0.ssm_in.weight.lora_a": np.zeros((2, 32)), "blk.0.ssm_in.weight.lora_b": np.zeros((32, 2))}, {},
     r"tensor blk\.0\.ssm_in\.weight\.lora_a targets ssm_in"),
    ({"token_embd.weight": np.zeros((4, 32))}, {}, r"tensor token_embd\.weight is not a LoRA tensor"),
    ({"blk.0.attn_q.weight.lora_a": np.zeros((2, 32)), "blk.0.attn_q.weight.lora_b": np.zeros((32, 2))},
     {"arch": "gemma3"}, r"adapter architecture 'gemma3' does not match the base model's 'llama'"),
    ({"blk.0.attn_q.weight.lora_a": np.zeros((2, 32)), "blk.0.attn_q.weight.lora_b": np.zeros((32, 2))},
     {"general_type": "model"}, r"not a LoRA adapter"),
    ({"blk.0.attn_q.weight.lora_a": np.full((2, 32), np.nan), "blk.0.attn_q.weight.lora_b": np.zeros((32, 2))},
     {}, r"tensor blk\.0\.attn_q\.weight\.lora_a holds non-finite values"),
])
def test_mismatched_adapters_are_refused_naming_the_tensor(tiny_model: Model, tmp_path: Path, tensors: dict,
                                                           kwargs: dict, message: str) -> None:
    path = write_adapter(tmp_path / "bad.gguf", tensors, **kwargs)
    with pytest.raises(AdapterLoadError, match=message) as info:
        tiny_model.load_adapter(path, "bad")
    assert isinstance(info.value, ModelLoadError) and str(path) in str(info.value)


def test_malformed_or_missing_files_are_a_model_load_error(tiny_model: Model, tmp_path: Path) -> None:
    good = write_adapter(tmp_path / "good.gguf", random_pairs(TINY_SHAPES, N_LAYERS, 2))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:300])
    with pytest.raises(AdapterLoadError, match="cannot load LoRA adapter .*truncated.gguf: corrupt or truncated"):
        tiny_model.load_adapter(truncated, "t")
    with pytest.raises(AdapterLoadError, match="cannot load LoRA adapter"):
        tiny_model.load_adapter(tmp_path / "absent.gguf", "x")
    with pytest.raises(ModelLoadError, match="is a LoRA adapter, not a model"):
        Model.from_file(good)
