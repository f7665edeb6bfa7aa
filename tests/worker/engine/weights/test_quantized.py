"""Pending quantized projections build the same matrix as the float32 transforms would, and ops.linear gives the
product through each form's kernel, MXFP4's too (bit for bit its numpy reference), narrow steps and wide ones
alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support.quant_data import random_blocks, random_mxfp4
from worker.engine import ops
from worker.engine.architectures.common import fold_norm, fuse_rows, scale_rows, unpermute_rope_rows
from worker.engine.formats.repack_cache import cached_blocks
from worker.engine.kernels import interleaved_k_matmul, interleaved_matmul, mxfp4_matmul
from worker.engine.weights.interleaved_blocks import InterleavedBlocks
from worker.engine.weights.interleaved_k_blocks import InterleavedK, interleave_k
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4
from worker.engine.weights.k_blocks import decode_k_blocks
from worker.engine.weights.mxfp4_blocks import decode_mxfp4
from worker.engine.weights.quant_blocks import BlockCodes
from worker.engine.weights.quantized import (
    PendingLinear,
    QuantizedLinear,
    StackedBlocks,
    build_codes,
    build_in_memory,
    held_matrices,
    materialize,
)


def random_pending(rng: np.random.Generator, name: str, out_dim: int, in_dim: int, group: int = 32,
                   levels: int = 16) -> tuple[PendingLinear, np.ndarray]:
    """A random block-coded projection as the loader sees it (codes in 0..levels-1), and its float32 matrix."""
    blocks = BlockCodes(rng.integers(0, levels, (out_dim, in_dim), dtype=np.uint8),
                        rng.uniform(0.01, 0.1, (out_dim, in_dim // group)).astype(np.float32),
                        rng.uniform(-0.5, 0.5, (out_dim, in_dim // group)).astype(np.float32), group)
    return PendingLinear(name, (out_dim, in_dim), group, lambda: blocks), blocks.dequantize()


def built(pending: PendingLinear) -> QuantizedLinear:
    """The pending projection materialized in memory."""
    return materialize((pending,), build_in_memory)[0]


@pytest.mark.parametrize("rows", [1, 2, 8, 70])
def test_transforms_build_the_float32_transformed_matrix(rows: int) -> None:
    rng = np.random.default_rng(rows)
    (q, q32), (k, k32) = random_pending(rng, "q", 64, 96), random_pending(rng, "k", 32, 96)
    v, v32 = random_pending(rng, "v", 32, 96, group=16)
    norm = rng.uniform(0.5, 1.5, 96).astype(np.float32)  # (in,)
    pending = fold_norm(fuse_rows(scale_rows(unpermute_rope_rows(q, 4), np.float32(0.25)),
                                  unpermute_rope_rows(k, 2), v), norm)
    assert isinstance(pending, PendingLinear) and pending.group == 16 and pending.shape == (128, 96)
    reference = fold_norm(fuse_rows(scale_rows(unpermute_rope_rows(q32, 4), np.float32(0.25)),
                                    unpermute_rope_rows(k32, 2), v32), norm)  # (128, 96) the float32 path
    np.testing.assert_allclose(pending.dequantize(), reference, rtol=1e-6, atol=1e-7)
    weight = built(pending)
    x = rng.standard_normal((rows, 96)).astype(np.float32)  # (N, in)
    np.testing.assert_allclose(ops.linear(x, weight), x @ reference.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("levels", "nibbles"), [(16, True), (64, False)])
@pytest.mark.parametrize("rows", [1, 5, 16, 80])
def test_groups_of_32_are_interleaved_and_multiply_at_every_width(rows: int, levels: int, nibbles: bool) -> None:
    """Codes of groups of 32 columns are built interleaved (half a byte a code where every code is below 16), and
    ops multiplies them with the integer kernels at every step width: the same bits as the kernels' numpy reference,
    within int8 activations' error of the float32 product; an embedding lookup gives the float32 rows exactly."""
    rng = np.random.default_rng(rows)
    pending, dense = random_pending(rng, "w", 40, 96, levels=levels)
    weight = built(pending)
    assert isinstance(weight.blocks, InterleavedBlocks) and weight.blocks.nibbles == nibbles
    assert weight.shape == (40, 96) and weight.blocks.offset is not None  # random offsets: no integer zero point
    x = rng.standard_normal((rows, 96)).astype(np.float32)  # (N, in)
    expected = interleaved_matmul.reference_matmul(x, weight.blocks)  # (N, out)
    assert np.array_equal(ops.linear(x, weight), expected) and np.array_equal(ops.linear_rows(x, weight), expected)
    assert ops.linear_rows(x, weight).flags.c_contiguous
    exact = x @ dense.T  # (N, out)
    assert np.abs(expected - exact).max() <= 0.02 * np.abs(exact).max()
    tokens = np.array([3, 0, 39])  # (N,)
    np.testing.assert_array_equal(ops.embedding_rows(weight, tokens), dense[tokens])


def test_embedding_rows_dequantize_only_the_rows_asked() -> None:
    rng = np.random.default_rng(5)
    pending, dense = random_pending(rng, "e", 50, 64)
    table = built(pending)
    tokens = np.array([3, 0, 49, 3])  # (N,)
    np.testing.assert_array_equal(ops.embedding_rows(table, tokens), dense[tokens])
    assert ops.embedding_rows(table, tokens).dtype == np.float32


def test_materialize_builds_each_key_once_and_keeps_ties() -> None:
    rng = np.random.default_rng(6)
    pending, _ = random_pending(rng, "e", 8, 32)
    calls = []

    @dataclass(frozen=True)
    class Weights:
        embedding: object
        layers: tuple
        output: object

    def source(pendings: list[PendingLinear]) -> dict[str, BlockCodes]:
        calls.extend(p.key for p in pendings)
        return {p.key: build_codes(p) for p in pendings}

    weights = materialize(Weights(pending, (pending.scale_rows(np.float32(2.0)),), pending), source)
    assert weights.output is weights.embedding and isinstance(weights.output, QuantizedLinear)
    assert sorted(set(calls)) == ["e", "e|scale:2.0"]


def test_mixed_fusing_falls_back_to_float32() -> None:
    rng = np.random.default_rng(4)
    q, q32 = random_pending(rng, "q", 16, 64)
    plain = rng.standard_normal((8, 64)).astype(np.float32)
    fused = fuse_rows(q, plain)
    assert isinstance(fused, np.ndarray)
    np.testing.assert_array_equal(fused, np.concatenate([q32, plain]))


def k_pending(rng: np.random.Generator, name: str, kind: str, out_dim: int, in_dim: int) -> PendingLinear:
    """A random Q4_K or Q6_K projection as the loader sees it."""
    blocks = decode_k_blocks(random_blocks(kind, out_dim, in_dim, rng), kind, (out_dim, in_dim))
    return PendingLinear(name, (out_dim, in_dim), blocks.group, lambda: blocks)


@pytest.mark.parametrize("rows", [1, 20])
def test_k_quant_parts_of_two_kinds_stack_each_in_its_own_form(rows: int, tmp_path: Path) -> None:
    """A Q4_K query and key fused with a Q6_K value: q and k become one Q4_K matrix, v stays Q6_K, and the product
    is the three products joined (through the repack cache too)."""
    rng = np.random.default_rng(9)
    q, k = k_pending(rng, "q", "Q4_K", 64, 512), k_pending(rng, "k", "Q4_K", 32, 512)
    v = k_pending(rng, "v", "Q6_K", 32, 512)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"stand-in model file")
    norm = rng.uniform(0.5, 1.5, 512).astype(np.float32)  # (in,)
    pending = fold_norm(fuse_rows(scale_rows(q, np.float32(0.5)), k, v), norm)
    x = rng.standard_normal((rows, 512)).astype(np.float32)  # (N, in)
    parts = [scale_rows(q, np.float32(0.5)), k, v]
    expected = np.concatenate([interleaved_k_matmul.interleaved_k_matmul(x * norm, interleave_k(p.build()))
                               for p in parts], axis=1)  # (N, 128)
    for weight in (built(pending), materialize((pending,), lambda ps: cached_blocks(model, ps, tmp_path))[0]):
        assert isinstance(weight.blocks, StackedBlocks) and weight.shape == (128, 512)
        assert [(p.kind, p.shape) for p in weight.blocks.parts] == [("Q4_K", (96, 512)), ("Q6_K", (32, 512))]
        assert all(isinstance(p, InterleavedK) for p in weight.blocks.parts)
        np.testing.assert_array_equal(ops.linear(x, weight), expected)
        np.testing.assert_array_equal(weight.blocks.dequantize(), np.concatenate([p.dequantize() for p in parts]))


def test_held_matrices_are_every_projection_and_a_stack_s_parts() -> None:
    """What a load warms the kernels for: each projection's matrix, a stacked projection's parts one by one, wherever
    the weights hold them (dataclasses, tuples)."""
    rng = np.random.default_rng(3)
    q, k = k_pending(rng, "q", "Q4_K", 64, 512), k_pending(rng, "k", "Q4_K", 32, 512)
    v = k_pending(rng, "v", "Q6_K", 32, 512)
    plain, _ = random_pending(rng, "o", 16, 64)

    @dataclass(frozen=True)
    class Layer:
        qkv: object
        o: object

    weights = materialize((Layer(fuse_rows(q, k, v), plain), np.zeros(3, np.float32)), build_in_memory)
    held = held_matrices(weights)
    assert [(type(m).__name__, m.kind if isinstance(m, InterleavedK) else None) for m in held] == [
        ("InterleavedK", "Q4_K"), ("InterleavedK", "Q6_K"), ("InterleavedBlocks", None)]


def mxfp4_pending(rng: np.random.Generator, name: str, out_dim: int, in_dim: int) -> tuple[PendingLinear, np.ndarray]:
    """A random MXFP4 projection as the loader sees it, and its float32 matrix."""
    blocks = decode_mxfp4(random_mxfp4(out_dim, in_dim, rng, (118, 130)), (out_dim, in_dim))
    return PendingLinear(name, (out_dim, in_dim), 32, lambda: blocks), blocks.dequantize()


@pytest.mark.parametrize("rows", [1, 20])
def test_mxfp4_parts_stack_and_multiply_through_their_kernel(rows: int, tmp_path: Path) -> None:
    """An MXFP4 gate (rows permuted and scaled) fused with an MXFP4 up is one interleaved MXFP4 matrix; fused with
    block codes each part keeps its form; built in memory or through the repack cache, ops.linear gives the kernels'
    bits, the weights are the float32 transforms' exactly, an embedding lookup gives the float32 rows."""
    rng = np.random.default_rng(rows)
    (gate, gate32), (up, up32) = mxfp4_pending(rng, "gate", 48, 128), mxfp4_pending(rng, "up", 32, 128)
    codes, codes32 = random_pending(rng, "v", 16, 128)
    fused = fuse_rows(scale_rows(unpermute_rope_rows(gate, 4), np.float32(0.5)), up)
    reference = fuse_rows(scale_rows(unpermute_rope_rows(gate32, 4), np.float32(0.5)), up32)  # (80, 128)
    mixed = fuse_rows(gate, codes)
    x = rng.standard_normal((rows, 128)).astype(np.float32)  # (N, in)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"stand-in model file")
    for source in (build_in_memory, lambda ps: cached_blocks(model, ps, tmp_path)):
        weight, both = materialize((fused, mixed), source)
        assert isinstance(weight.blocks, InterleavedMXFP4) and weight.shape == (80, 128)
        np.testing.assert_array_equal(weight.blocks.dequantize(), reference)
        np.testing.assert_array_equal(ops.linear(x, weight), mxfp4_matmul.reference_matmul(x, weight.blocks))
        tokens = np.array([3, 0, 79])  # (N,)
        np.testing.assert_array_equal(ops.embedding_rows(weight, tokens), reference[tokens])
        assert isinstance(both.blocks, StackedBlocks) and both.shape == (64, 128)
        first, second = both.blocks.parts
        assert isinstance(first, InterleavedMXFP4) and isinstance(second, InterleavedBlocks)
        expected = np.concatenate([mxfp4_matmul.reference_matmul(x, first),
                                   interleaved_matmul.reference_matmul(x, second)], axis=1)  # (N, 64)
        np.testing.assert_array_equal(ops.linear(x, both), expected)
        np.testing.assert_array_equal(both.blocks.dequantize(), np.concatenate([gate32, codes32]))
