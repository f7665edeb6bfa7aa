"""Loading GGUF files: every malformed file gives one clear ModelLoadError naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_gguf import write_tiny_gguf

from worker.engine.errors import ModelLoadError
from worker.engine.gguf_file import read_gguf
from worker.engine.model import Model


def test_reads_and_dequantizes(tiny_gguf_path: Path) -> None:
    contents = read_gguf(tiny_gguf_path)
    assert contents.metadata["general.architecture"] == "llama"
    embd = contents.tensors["token_embd.weight"]
    assert embd.dtype == np.float32 and embd.shape[1] == 32  # Q8_0 dequantized, (V, D)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such file"):
        Model.from_file(tmp_path / "absent.gguf")


def test_wrong_magic(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF file") as info:
        Model.from_file(bad)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize("keep", [0.3, 0.9])
def test_truncated(tiny_gguf_path: Path, tmp_path: Path, keep: float) -> None:
    data = tiny_gguf_path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError) as info:
        Model.from_file(cut)
    assert str(cut) in str(info.value)


def test_missing_tensor(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "missing.gguf", drop="blk.1.ffn_up.weight")
    with pytest.raises(ModelLoadError, match="blk.1.ffn_up.weight is missing"):
        Model.from_file(path)


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "arch.gguf", arch="mamba")
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'mamba' \(supported: gemma3, llama, qwen2\)"):
        Model.from_file(path)


def test_separate_output_weight(tmp_path: Path) -> None:
    model = Model.from_file(write_tiny_gguf(tmp_path / "untied.gguf", tied=False))
    assert model.weights.output is not model.weights.token_embedding
