"""worker.engine.weights.mxfp4_blocks: MXFP4 (GGML type 39) dequantizes exactly as gguf and llama.cpp do, the exponent's
edges included; its file form keeps the file's bytes, and its row transforms and stacking keep the weights; a GGUF
file's MXFP4 tensor is kept in that form."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tests.support.quant_data import random_mxfp4
from worker.engine.formats.gguf_file import read_gguf
from worker.engine.weights.mxfp4_blocks import (
    BLOCK_BYTES,
    MXFP4,
    MXFP4Blocks,
    decode_mxfp4,
    dequantize_mxfp4,
    e8m0_half,
)
from worker.engine.weights.quant_blocks import SUPPORTED, code_group, decode_block_codes, held_bytes


def ggufs(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """gguf's own dequantization: (rows, cols) float32."""
    with np.errstate(over="ignore"):
        return dequantize(raw, GGMLQuantizationType.MXFP4).reshape(rows, cols)


def test_e8m0_half_is_a_power_of_two_with_llama_cpps_edges() -> None:
    """2**(e - 128) for every byte: e = 0 and 1 the subnormals 2**-128 and 2**-127, e = 255 2**127 (no NaN)."""
    e = np.arange(256, dtype=np.uint8)
    got = e8m0_half(e)  # (256,)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.astype(np.float64), np.ldexp(1.0, e.astype(np.int64) - 128))
    assert got.view(np.uint32)[0] == 0x00200000 and got.view(np.uint32)[1] == 0x00400000
    np.testing.assert_array_equal(got, gguf.quants.MXFP4.e8m0_to_fp32_half(e))


def test_the_reference_dequantization_is_ggufs_on_random_bytes() -> None:
    rows, cols = 9, 512
    raw = random_mxfp4(rows, cols, np.random.default_rng(1))  # every exponent byte, e = 254 and 255 among them
    raw.reshape(rows, -1, BLOCK_BYTES)[0, :4, 0] = (0, 1, 254, 255)
    expected = ggufs(raw, rows, cols)  # (rows, cols)
    got = dequantize_mxfp4(raw, (rows, cols))
    assert got.dtype == np.float32 and np.isinf(expected).any() and (expected == 0).any()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(decode_mxfp4(raw, (rows, cols)).dequantize(), expected)


@pytest.mark.parametrize("e", [0, 1, 2, 127, 128, 253, 254, 255])
def test_every_code_at_an_edge_exponent(e: int) -> None:
    """All sixteen codes (both nibbles) at one exponent: the values times 2**(e - 128), inf past float32's range."""
    block = np.empty(BLOCK_BYTES, np.uint8)  # (17,)
    block[0] = e
    block[1:] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    raw = block[None, :]  # (1, 17)
    np.testing.assert_array_equal(dequantize_mxfp4(raw, (1, 32)), ggufs(raw, 1, 32))


def test_the_form_keeps_the_files_bytes() -> None:
    rows, cols = 3, 128
    raw = random_mxfp4(rows, cols, np.random.default_rng(2))
    blocks = decode_mxfp4(raw, (rows, cols))
    split = raw.reshape(rows, cols // 32, BLOCK_BYTES)  # (rows, B, 17)
    np.testing.assert_array_equal(blocks.exponents, split[:, :, 0])
    np.testing.assert_array_equal(blocks.codes, split[:, :, 1:].reshape(rows, cols // 2))
    codes = blocks.code_rows()  # (rows, cols): byte j holds column j low, column 16 + j high
    np.testing.assert_array_equal(codes[:, 16:32], split[:, 0, 1:] >> 4)
    np.testing.assert_array_equal(codes[:, 0:16], split[:, 0, 1:] & 0x0F)
    assert blocks.shape == (rows, cols) and blocks.nbytes == rows * (cols // 2 + cols // 32 + 4)  # and a row scale


def test_transforms_keep_the_weights() -> None:
    rng = np.random.default_rng(5)
    a = decode_mxfp4(random_mxfp4(4, 64, rng, (110, 130)), (4, 64))
    b = decode_mxfp4(random_mxfp4(3, 64, rng, (110, 130)), (3, 64))
    dense = a.dequantize()  # (4, 64)
    order = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(a.take_rows(order).dequantize(), dense[order])
    np.testing.assert_array_equal(a.scaled(np.float32(0.25)).dequantize(), dense * np.float32(0.25))
    np.testing.assert_allclose(a.scaled(np.float32(0.3)).dequantize(), dense * 0.3, rtol=1e-6)
    stacked = a.scaled(np.float32(2.0)).stacked([b])
    assert isinstance(stacked, MXFP4Blocks) and stacked.shape == (7, 64)
    np.testing.assert_array_equal(stacked.dequantize(), np.concatenate([dense * 2, b.dequantize()]))
    np.testing.assert_array_equal(a.rows(np.array([3, 3, 0])), dense[[3, 3, 0]])


def test_the_registries_know_the_kind() -> None:
    """Kept quantized in groups of 32 (rows of a multiple of 32), never as 8-bit block codes."""
    assert MXFP4 in SUPPORTED and code_group(MXFP4, 2880) == 32 and code_group(MXFP4, 48) is None
    assert held_bytes(MXFP4, 32) == 17  # 4.25 bits a weight, as the file (the float32 row scales not counted)
    raw = random_mxfp4(2, 64, np.random.default_rng(3))
    assert decode_block_codes(raw, MXFP4, (2, 64)) is None


def test_a_gguf_files_mxfp4_tensor_is_kept_in_this_form(tmp_path: Path) -> None:
    """Read from a file: kept undecoded with keep_quantized, decoded to this form; float32 otherwise."""
    rows, cols = 5, 96
    raw = random_mxfp4(rows, cols, np.random.default_rng(4), (100, 140))
    path = tmp_path / "mxfp4.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=GGMLQuantizationType.MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    kept = read_gguf(path, keep_quantized=True).quantized["blk.0.ffn_up.weight"]
    assert kept.kind == MXFP4 and kept.shape == (rows, cols)
    blocks = kept.decode()
    assert isinstance(blocks, MXFP4Blocks)
    np.testing.assert_array_equal(blocks.dequantize(), ggufs(raw, rows, cols))
    np.testing.assert_array_equal(read_gguf(path).tensors["blk.0.ffn_up.weight"], ggufs(raw, rows, cols))
