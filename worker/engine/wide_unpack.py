"""K-quant super-blocks unpacked across sixteen weight rows for wide_tiles.py: codes and sub-scales of sixteen rows
transposed with 512-bit shuffles into simd_wide.py's layout (row r in lane r, or bytes 4r..4r+3), each the
eight-row transpose of simd_rows.py done on both 256-bit halves at once.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from worker.engine.simd_int import _V8I32, _pointer
from worker.engine.simd_rows import _offset, _store_vectors, _transpose8
from worker.engine.simd_wide import _I8, _I64, _V16I32, _V64I8


@intrinsic
def transpose_scales32(typingctx: Any, array: Any, index: Any, stride: Any, out: Any, out_index: Any,
                       step: Any) -> Any:
    """The eight uint8 (or int8) at index + r * stride (r < 8) as int32 (zero- or sign-extended), side by side: out
    (a flat int32 array) gets vector j, row r's byte j in lane r, at out_index + j * step."""
    signed = array.dtype.signed

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        rows = []
        for row in range(8):
            pointer = _pointer(context, builder, signature.args[0], args[0], _offset(builder, args[1], args[2], row),
                               ir.VectorType(_I8, 8))
            rows.append((builder.sext if signed else builder.zext)(builder.load(pointer, align=1), _V8I32))
        _store_vectors(context, builder, signature.args[3], args[3], args[4], _transpose8(builder, rows), args[5])
        return context.get_dummy_value()

    return types.none(array, types.int64, types.int64, out, types.int64, types.int64), codegen


def _transpose_pairs(builder: Any, rows: list[Any]) -> list[Any]:
    """Eight <16 x i32> (row r in lanes 0..7, row r + 8 in lanes 8..15) as their eight columns: out[c] holds row r's
    dword c in lane r and row r + 8's in lane 8 + r (simd_rows._transpose8 in each half at once)."""

    def shuffle(a: Any, b: Any, mask: list[int]) -> Any:
        wide = [m if m < 8 else m + 8 for m in mask]  # the eight-lane mask's lanes of b sit at 16.. here
        full = wide + [m + 8 for m in wide]  # the same on the high halves
        return builder.shuffle_vector(a, b, ir.Constant(_V16I32, full))

    pairs = []
    for p in range(4):
        a, b = rows[2 * p], rows[2 * p + 1]
        pairs.append((shuffle(a, b, [0, 8, 1, 9, 4, 12, 5, 13]), shuffle(a, b, [2, 10, 3, 11, 6, 14, 7, 15])))
    quads = []
    for p in (0, 2):
        for part in range(2):
            a, b = pairs[p][part], pairs[p + 1][part]
            quads.append(shuffle(a, b, [0, 1, 8, 9, 4, 5, 12, 13]))
            quads.append(shuffle(a, b, [2, 3, 10, 11, 6, 7, 14, 15]))
    columns: list[Any] = [None] * 8
    for c in range(4):
        low, high = quads[c], quads[4 + c]
        columns[c] = shuffle(low, high, [0, 1, 2, 3, 8, 9, 10, 11])
        columns[c + 4] = shuffle(low, high, [4, 5, 6, 7, 12, 13, 14, 15])
    return columns


@intrinsic
def unpack_nibbles16(typingctx: Any, array: Any, index: Any, stride: Any, out: Any, out_index: Any) -> Any:
    """A Q4_K super-block's codes of sixteen rows (128 packed bytes at index + r * stride, r < 16), interleaved for
    the wide tiles: out[out_index + (8j + c) * 64 + 4r + e] = the code of row r, block j, column 4c + e (block 2t's
    codes are the low nibbles of packed bytes 32t..32t+31, block 2t+1's the high ones)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        low_mask = ir.Constant(_V64I8, [0x0F] * 64)
        four = ir.Constant(_V64I8, [4] * 64)
        halves = ir.Constant(_V16I32, list(range(16)))
        for t in range(4):
            rows = []
            for row in range(8):
                first, second = (builder.load(_pointer(context, builder, signature.args[0], args[0],
                                                       builder.add(_offset(builder, args[1], args[2], r),
                                                                   ir.Constant(_I64, 32 * t)), _V8I32), align=1)
                                 for r in (row, row + 8))
                rows.append(builder.shuffle_vector(first, second, halves))
            for c, column in enumerate(_transpose_pairs(builder, rows)):
                octets = builder.bitcast(column, _V64I8)
                for j, codes in ((2 * t, builder.and_(octets, low_mask)), (2 * t + 1, builder.lshr(octets, four))):
                    at = builder.add(args[4], ir.Constant(_I64, (8 * j + c) * 64))
                    builder.store(codes, _pointer(context, builder, signature.args[3], args[3], at, _V64I8), align=1)
        return context.get_dummy_value()

    return types.none(array, types.int64, types.int64, out, types.int64), codegen


def _columns16(context: Any, builder: Any, array_type: Any, array: Any, index: Any, stride: Any, offset: int) -> Any:
    """The 32 bytes at index + r * stride + offset of sixteen rows, transposed (_transpose_pairs' columns)."""
    halves = ir.Constant(_V16I32, list(range(16)))
    rows = []
    for row in range(8):
        first, second = (builder.load(_pointer(context, builder, array_type, array,
                                               builder.add(_offset(builder, index, stride, r), ir.Constant(_I64, offset)),
                                               _V8I32), align=1) for r in (row, row + 8))
        rows.append(builder.shuffle_vector(first, second, halves))
    return [builder.bitcast(column, _V64I8) for column in _transpose_pairs(builder, rows)]


@intrinsic
def unpack_q6_16(typingctx: Any, low: Any, index: Any, stride: Any, high: Any, high_index: Any, high_stride: Any,
                 out: Any, out_index: Any) -> Any:
    """A Q6_K super-block's codes (0..63) of sixteen rows, interleaved as unpack_nibbles16's: the low four bits from
    128 bytes at index + r * stride (chunk t of 32 holds blocks 2(t//2) + t%2 in its low nibbles and that + 2 in its
    high ones), bits 4-5 from 64 bytes at high_index + r * high_stride (chunk u holds blocks 4u..4u+3, two bits
    each), as int_kernels._q6k_codes orders them."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        low_mask, three = ir.Constant(_V64I8, [0x0F] * 64), ir.Constant(_V64I8, [3] * 64)
        for u in range(2):
            bits = _columns16(context, builder, signature.args[3], args[3], args[4], args[5], 32 * u)
            chunks = [_columns16(context, builder, signature.args[0], args[0], args[1], args[2], 32 * (2 * u + p))
                      for p in range(2)]
            for c in range(8):
                for j in range(4 * u, 4 * u + 4):
                    packed = chunks[j % 2][c]
                    nibbles = (builder.lshr(packed, ir.Constant(_V64I8, [4] * 64)) if (j // 2) % 2
                               else builder.and_(packed, low_mask))
                    top = builder.and_(builder.lshr(bits[c], ir.Constant(_V64I8, [2 * (j % 4)] * 64)), three)
                    codes = builder.or_(nibbles, builder.shl(top, ir.Constant(_V64I8, [4] * 64)))
                    at = builder.add(args[7], ir.Constant(_I64, (8 * j + c) * 64))
                    builder.store(codes, _pointer(context, builder, signature.args[6], args[6], at, _V64I8), align=1)
        return context.get_dummy_value()

    return types.none(low, types.int64, types.int64, high, types.int64, types.int64, out, types.int64), codegen
