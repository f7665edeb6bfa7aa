"""The two vector operations the MXFP4 kernel (mxfp4_matmul.py) adds to simd_wide.py's: a sixteen-entry byte
table looked up by four-bit codes (one `vpshufb` on the avx512vnni path, two on avx2, a chain of selects on the
generic path: the same bytes on every path), and E8M0 exponent bytes as the float32 powers of two they stand for.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.extending import intrinsic

from worker.engine.kernels.simd_int import _I32, _function, avx2_instructions, int_path
from worker.engine.kernels.simd_wide import float32x16, int8x64, int32x16

_I8 = ir.IntType(8)
_V64I8, _V32I8, _V16I32 = ir.VectorType(_I8, 64), ir.VectorType(_I8, 32), ir.VectorType(_I32, 16)
_V16F = ir.VectorType(ir.FloatType(), 16)


def _splat(builder: Any, value: Any, vector: ir.VectorType) -> Any:
    """A scalar in every lane of `vector`."""
    first = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, vector.count), [0] * vector.count))


def _pshufb_halves(builder: Any, table: Any, codes: Any) -> Any:
    """vpshufb (avx2) on each 256-bit half, joined."""
    shuffle = _function(builder, "llvm.x86.avx2.pshuf.b", _V32I8, [_V32I8, _V32I8])
    halves = []
    for h in range(2):
        mask = ir.Constant(ir.VectorType(_I32, 32), list(range(32 * h, 32 * h + 32)))
        halves.append(builder.call(shuffle, [builder.shuffle_vector(table, table, mask),
                                             builder.shuffle_vector(codes, codes, mask)]))
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 64), list(range(64))))


def _select_chain(builder: Any, table: Any, codes: Any) -> Any:
    """table[code] by sixteen compares and selects (portable code)."""
    result = ir.Constant(_V64I8, [0] * 64)
    for entry in range(16):
        value = _splat(builder, builder.extract_element(table, ir.Constant(_I32, entry)), _V64I8)
        matches = builder.icmp_unsigned("==", codes, ir.Constant(_V64I8, [entry] * 64))
        result = builder.select(matches, value, result)
    return result


@intrinsic
def wlookup16(typingctx: Any, table: Any, codes: Any) -> Any:
    """Byte by byte, table[code] for codes 0..15, where `table` holds the sixteen entries in each 128-bit lane (bytes
    16l .. 16l + 15 for l < 4)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        table, codes = args
        if int_path() == "avx512vnni":  # (the path needs AVX-512 BW: vpshufb on 512 bits)
            return builder.call(_function(builder, "llvm.x86.avx512.pshuf.b.512", _V64I8, [_V64I8, _V64I8]),
                                [table, codes])
        if avx2_instructions():
            return _pshufb_halves(builder, table, codes)
        return _select_chain(builder, table, codes)

    return int8x64(int8x64, int8x64), codegen


@intrinsic
def wexp_half(typingctx: Any, exponents: Any) -> Any:
    """GGML_E8M0_TO_FP32_HALF of sixteen int32 lanes holding exponent bytes 0..255: the float32 with bits
    (e - 1) << 23 (2**(e - 128)), and for e = 0 and 1 the subnormals 0x00200000 << e (2**-128, 2**-127)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        e = args[0]
        small = builder.icmp_unsigned("<", e, ir.Constant(_V16I32, [2] * 16))
        subnormal = builder.shl(ir.Constant(_V16I32, [0x00200000] * 16),
                                builder.and_(e, ir.Constant(_V16I32, [1] * 16)))
        normal = builder.shl(builder.sub(e, ir.Constant(_V16I32, [1] * 16)), ir.Constant(_V16I32, [23] * 16))
        return builder.bitcast(builder.select(small, subnormal, normal), _V16F)

    return float32x16(int32x16), codegen
