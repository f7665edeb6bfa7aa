"""Loading GGUF files: every malformed file gives one clear ModelLoadError naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.tiny_gguf import write_tiny_gguf
from worker.engine.errors import ModelLoadError
from worker.engine.formats.gguf_file import read_gguf
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
    supported = "bert, gemma3, gpt-oss, llama, qwen2, qwen3, qwen35, qwen35moe, qwen3moe, smollm3"
    with pytest.raises(ModelLoadError, match=rf"unsupported architecture 'mamba' \(supported: {supported}\)"):
        Model.from_file(path)


def test_separate_output_weight(tmp_path: Path) -> None:
    model = Model.from_file(write_tiny_gguf(tmp_path / "untied.gguf", tied=False))
    assert model.weights.output is not model.weights.token_embedding


def test_own_parser_agrees_with_the_gguf_package(tiny_gguf_path: Path) -> None:
    """Metadata and raw tensors as gguf's own (slow) reader sees them."""
    import gguf
    from gguf.quants import dequantize

    from worker.engine.formats.gguf_file import read_metadata

    reader = gguf.GGUFReader(str(tiny_gguf_path), "r")
    expected = {}
    for name, field in reader.fields.items():
        value = field.contents()
        expected[name] = value.item() if isinstance(value, np.generic) else value
    assert read_metadata(tiny_gguf_path) == expected
    contents = read_gguf(tiny_gguf_path)
    for tensor in reader.tensors:
        want = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape.tolist())))
        assert np.array_equal(contents.tensors[tensor.name], want), tensor.name


def test_a_bad_tensor_type_is_named(tiny_gguf_path: Path, tmp_path: Path) -> None:
    import struct

    from worker.engine.formats.gguf_file import _Cursor, _open, _parse_metadata

    buffer = _open(tiny_gguf_path)
    cursor = _Cursor(buffer)
    _parse_metadata(cursor, tiny_gguf_path)
    name = cursor.string()
    type_pos = cursor.pos + 4 + 8 * cursor.scalar("<I")
    data = bytearray(tiny_gguf_path.read_bytes())
    data[type_pos : type_pos + 4] = struct.pack("<I", 999)
    bad = tmp_path / "badtype.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=f"tensor {name}: unknown type 999"):
        read_gguf(bad)
