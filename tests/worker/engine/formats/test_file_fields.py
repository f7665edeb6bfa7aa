"""Honour or refuse, both ways: every key an architecture's table says it reads changes what the engine computes
(the logits, the loaded configuration, or the load itself), and every key or tensor it does not read, whose value
llama.cpp would act on, is refused at load by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from tests.support.gguf_edit import edited_copy
from worker.engine.architectures import ARCHITECTURES
from worker.engine.errors import ModelLoadError
from worker.engine.formats.file_fields import DECODER_KEYS, NEUTRAL_VALUES
from worker.engine.forward_batch import BatchEntry
from worker.engine.model import Model

PROMPT = np.array([1, 504, 3458, 282, 3101, 30, 216, 1517] * 5)  # (40,)
# A changed value for every key of the decoder table (the tiny twins' values are the converter's).
CHANGED: dict[str, Any] = {
    "block_count": 3, "context_length": 1024, "embedding_length": 96, "feed_forward_length": 128,
    "attention.head_count": 8, "attention.head_count_kv": 4, "attention.key_length": 8, "attention.value_length": 8,
    "attention.layer_norm_rms_epsilon": 0.5, "rope.freq_base": 99.0, "rope.dimension_count": 8,
    "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scale_linear": 4.0, "rope.scaling.attn_factor": 0.5,
    "rope.scaling.original_context_length": 16, "vocab_size": 1000, "pooling_type": 3,
}
EXPERTS_CHANGED: dict[str, Any] = {  # and of the routed FFN's table
    "expert_count": 4, "expert_used_count": 3, "expert_feed_forward_length": 512, "expert_weights_scale": 2.0,
}
HYBRID_CHANGED: dict[str, Any] = {  # and of the hybrid (gated delta-net) table
    "ssm.conv_kernel": 3, "ssm.inner_size": 64, "ssm.state_size": 16, "ssm.time_step_rank": 2, "ssm.group_count": 1,
    "full_attention_interval": 2, "attention.recurrent_layers": [True, False, False, True],
    "rope.dimension_sections": [4, 0, 0, 0], "nextn_predict_layers": 1,
}


@pytest.fixture(scope="module")
def twins(twin_path: Callable[[str, str], Path]) -> dict[str, Path]:
    """The tiny llama3, qwen3, qwen3moe and qwen35 twins (F16)."""
    return {family: twin_path(family, "F16") for family in ("llama3", "qwen3", "qwen3moe", "qwen35")}


def last_logits(path: Path) -> np.ndarray:
    """The last logits (V,) of PROMPT through a fresh load of the file (no repack cache)."""
    model = Model.from_file(path, repack_dir=None)
    pool = model.new_pool(16 << 20, enable_prefix_caching=False)
    pool.ensure(0, len(PROMPT))
    return np.asarray(model.forward([BatchEntry(0, PROMPT, 0)], pool)[0])  # (V,)


def test_every_architecture_has_a_table() -> None:
    for name, architecture in ARCHITECTURES.items():
        assert architecture.metadata_keys, name
        assert not architecture.metadata_keys & set(NEUTRAL_VALUES) - DECODER_KEYS - set(EXPERTS_CHANGED) - set(
            HYBRID_CHANGED) - {"expert_shared_feed_forward_length",
            "attention.sliding_window", "final_logit_softcapping", "attention.causal"}, name


@pytest.mark.slow
@pytest.mark.parametrize("family, arch", [("llama3", "llama"), ("qwen3", "qwen3"), ("qwen3moe", "qwen3moe"),
                                          ("qwen35", "qwen35")])
def test_every_key_the_table_reads_changes_what_is_computed(twins: dict[str, Path], family: str, arch: str,
                                                            tmp_path: Path) -> None:
    changes = CHANGED | (EXPERTS_CHANGED if arch == "qwen3moe" else HYBRID_CHANGED if arch == "qwen35" else {})
    assert set(changes) == set(ARCHITECTURES[arch].metadata_keys)
    base = twins[family]
    base_logits = last_logits(base)
    base_config = Model.from_file(base, repack_dir=None).config
    for suffix, value in changes.items():
        changed = edited_copy(base, tmp_path / f"{suffix}.gguf", set_keys={f"{arch}.{suffix}": value})
        try:
            model = Model.from_file(changed, repack_dir=None)
        except ModelLoadError:
            continue  # a shape the tensors do not have: read, and refused
        if model.config != base_config:
            continue  # honoured in the configuration (a limit, a pooling, a scaling parameter)
        assert not np.array_equal(last_logits(changed), base_logits), f"{arch}.{suffix} changed nothing"


@pytest.mark.parametrize("family, arch, key, value", [
    ("llama3", "llama", "expert_count", 8), ("llama3", "llama", "attn_logit_softcapping", 50.0),
    ("llama3", "llama", "attention.sliding_window", 128), ("qwen3", "qwen3", "final_logit_softcapping", 30.0),
    ("qwen3", "qwen3", "ssm.state_size", 16), ("qwen3", "qwen3", "rope.scaling.yarn_log_multiplier", 0.1),
    ("qwen3", "qwen3", "embedding_length_per_layer_input", 256),
])
def test_an_unread_key_that_matters_is_refused_by_name(twins: dict[str, Path], family: str, arch: str, key: str,
                                                       value: Any, tmp_path: Path) -> None:
    changed = edited_copy(twins[family], tmp_path / "unread.gguf", set_keys={f"{arch}.{key}": value})
    with pytest.raises(ModelLoadError, match=f"{arch}.{key}".replace(".", r"\.")):
        Model.from_file(changed, repack_dir=None)


def test_an_unread_key_at_its_neutral_value_is_accepted(twins: dict[str, Path], tmp_path: Path) -> None:
    neutral = {"llama.expert_count": 0, "llama.attention.sliding_window": 0, "llama.rope.scaling.type": "none",
               "llama.rope.scaling.yarn_beta_fast": 32.0}
    changed = edited_copy(twins["llama3"], tmp_path / "neutral.gguf", set_keys=neutral)
    assert np.array_equal(last_logits(changed), last_logits(twins["llama3"]))


@pytest.mark.parametrize("family, name, shape", [
    ("llama3", "blk.0.attn_output.bias", (64,)),  # llama.cpp's llama reads it: the engine does not
    ("qwen3", "rope_freqs.weight", (16,)),  # llama.cpp's qwen3 has no frequency factors
    ("qwen3", "blk.1.ffn_gate_inp.weight", (8, 64)),  # a router: an MoE file under a dense name
])
def test_a_tensor_the_loader_does_not_read_is_refused_by_name(twins: dict[str, Path], family: str, name: str,
                                                              shape: tuple[int, ...], tmp_path: Path) -> None:
    changed = edited_copy(twins[family], tmp_path / "extra.gguf", add_tensors={name: np.ones(shape, np.float32)})
    with pytest.raises(ModelLoadError, match=f"tensor {name}".replace(".", r"\.")):
        Model.from_file(changed, repack_dir=None)


@pytest.mark.parametrize("kind", ["longrope", "dynamic", "su"])
def test_an_unsupported_rope_scaling_type_is_refused_by_name(twins: dict[str, Path], kind: str,
                                                             tmp_path: Path) -> None:
    changed = edited_copy(twins["llama3"], tmp_path / "scaling.gguf", set_keys={"llama.rope.scaling.type": kind})
    with pytest.raises(ModelLoadError, match=rf"llama\.rope\.scaling\.type = '{kind}'"):
        Model.from_file(changed, repack_dir=None)


def test_llama3_rope_freqs_are_read_and_change_the_logits(twins: dict[str, Path], tmp_path: Path) -> None:
    model = Model.from_file(twins["llama3"], repack_dir=None)
    half = model.config.rope_dim // 2
    unscaled = edited_copy(twins["llama3"], tmp_path / "unscaled.gguf")  # a copy, then its factors set to 1
    reader = gguf.GGUFReader(unscaled, "r+")  # the factors are float32 values in the file: rewritten in place
    factors = next(t for t in reader.tensors if t.name == "rope_freqs.weight").data  # (Dh/2,)
    assert factors.shape == (half,) and float(factors.max()) == 32.0  # Llama 3.2's factor on its low frequencies
    factors[:] = 1.0
    reader.data.flush()
    assert not np.array_equal(last_logits(unscaled), last_logits(twins["llama3"]))
