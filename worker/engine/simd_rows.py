"""Integer vectors across eight weight rows, for the interleaved tiles of int_tiles.py: in every vector here, lane
group r (bytes 4r..4r+3 of an int8x32, lanes 2r and 2r+1 of an int16x16, lane r of an int32x8) belongs to weight
row r of the tile, so a product of codes and one x row's activations lands in the lane of its own row and nothing
is summed across lanes. On AVX2 `vpmaddubsw` then `vpmaddwd`, else portable LLVM vector code with the same integers
(simd_int.py's paths and types).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from worker.engine.simd import float32x8
from worker.engine.simd_int import (
    _I16,
    _I32,
    _V8I32,
    _V16I8,
    _V16I16,
    _V32I8,
    PAIRED_GROUPS,
    _function,
    _maddwd,
    _pairs,
    _pointer,
    _splat,
    avx2_instructions,
    int8x32,
    int16x16,
    int32x8,
)

_I64 = ir.IntType(64)
_F32 = ir.FloatType()


def _offset(builder: Any, index: Any, stride: Any, row: int) -> Any:
    """index + row * stride (int64)."""
    return builder.add(index, builder.mul(stride, ir.Constant(_I64, row)))


def _transpose8(builder: Any, rows: list[Any]) -> list[Any]:
    """Eight <8 x i32> rows as their eight columns: out[c][r] = rows[r][c] (24 two-input shuffles: vpunpck*dq,
    vpunpck*qdq, vperm2i128 on AVX2)."""

    def shuffle(a: Any, b: Any, mask: list[int]) -> Any:
        return builder.shuffle_vector(a, b, ir.Constant(_V8I32, mask))

    pairs = []  # stage 1: rows 2p and 2p+1 interleaved by dwords
    for p in range(4):
        a, b = rows[2 * p], rows[2 * p + 1]
        pairs.append((shuffle(a, b, [0, 8, 1, 9, 4, 12, 5, 13]), shuffle(a, b, [2, 10, 3, 11, 6, 14, 7, 15])))
    quads = []  # stage 2: four rows' dword c (and c + 4) side by side, c = 0, 1, 2, 3
    for p in (0, 2):
        for part in range(2):
            a, b = pairs[p][part], pairs[p + 1][part]
            quads.append(shuffle(a, b, [0, 1, 8, 9, 4, 5, 12, 13]))
            quads.append(shuffle(a, b, [2, 3, 10, 11, 6, 7, 14, 15]))
    columns: list[Any] = [None] * 8  # stage 3: rows 0-3's column c beside rows 4-7's
    for c in range(4):
        low, high = quads[c], quads[4 + c]
        columns[c] = shuffle(low, high, [0, 1, 2, 3, 8, 9, 10, 11])
        columns[c + 4] = shuffle(low, high, [4, 5, 6, 7, 12, 13, 14, 15])
    return columns


def _store_vectors(context: Any, builder: Any, array_type: Any, array: Any, index: Any, vectors: list[Any],
                   step: Any) -> None:
    """Store <8 x i32> vectors into a flat array from `index` on, `step` elements apart (an int, or an int64 value)."""
    for number, vector in enumerate(vectors):
        distance = ir.Constant(_I64, step * number) if isinstance(step, int) else builder.mul(step, ir.Constant(_I64, number))
        at = builder.add(index, distance)
        builder.store(vector, _pointer(context, builder, array_type, array, at, _V8I32), align=1)


@intrinsic
def transpose_rows(typingctx: Any, array: Any, index: Any, stride: Any, out: Any, out_index: Any) -> Any:
    """The 32 bytes at index + r * stride of a flat uint8 array (r < 8), four at a time side by side: out gets, from
    out_index on, eight int8x32 where vector c holds bytes 4c..4c+3 of each row r in its bytes 4r..4r+3."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        rows = [builder.load(_pointer(context, builder, signature.args[0], args[0],
                                      _offset(builder, args[1], args[2], row), _V8I32), align=1) for row in range(8)]
        _store_vectors(context, builder, signature.args[3], args[3], args[4], _transpose8(builder, rows), 32)
        return context.get_dummy_value()

    return types.none(array, types.int64, types.int64, out, types.int64), codegen


@intrinsic
def transpose_scales(typingctx: Any, array: Any, index: Any, stride: Any, out: Any, out_index: Any) -> Any:
    """The eight uint8 (or int8) at index + r * stride (r < 8) as eight int16x16 from out_index of a flat int16
    array: vector j holds row r's byte j in lanes 2r and 2r+1 (a block's or a group's sub-scale of each row)."""
    signed = array.dtype.signed

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        rows = []
        for row in range(8):
            pointer = _pointer(context, builder, signature.args[0], args[0], _offset(builder, args[1], args[2], row),
                               ir.VectorType(ir.IntType(8), 8))
            octets = builder.load(pointer, align=1)
            words = (builder.sext if signed else builder.zext)(octets, ir.VectorType(_I16, 8))
            doubled = builder.shuffle_vector(words, words, ir.Constant(ir.VectorType(_I32, 16),
                                                                       [lane // 2 for lane in range(16)]))
            rows.append(builder.bitcast(doubled, _V8I32))
        _store_vectors(context, builder, signature.args[3], args[3], args[4], _transpose8(builder, rows), 16)
        return context.get_dummy_value()

    return types.none(array, types.int64, types.int64, out, types.int64), codegen


@intrinsic
def transpose_offsets(typingctx: Any, array: Any, index: Any, stride: Any, out: Any, out_index: Any, step: Any) -> Any:
    """Q6_K's sixteen int8 sub-scales at index + r * stride (r < 8), in PAIRED_GROUPS order and times 32, as eight
    int16x16 from out_index of a flat int16 array, `step` elements apart: vector p holds row r's paired scales 2p and
    2p+1 in lanes 2r and 2r+1 (the codes' -32, taken off per quarter and half with the group sums in the same
    order)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        rows = []
        for row in range(8):
            pointer = _pointer(context, builder, signature.args[0], args[0], _offset(builder, args[1], args[2], row),
                               _V16I8)
            octets = builder.load(pointer, align=1)
            paired = builder.shuffle_vector(octets, octets, ir.Constant(ir.VectorType(_I32, 16), list(PAIRED_GROUPS)))
            words = builder.shl(builder.sext(paired, _V16I16), _splat(_V16I16, 5))
            rows.append(builder.bitcast(words, _V8I32))
        _store_vectors(context, builder, signature.args[3], args[3], args[4], _transpose8(builder, rows), args[5])
        return context.get_dummy_value()

    return types.none(array, types.int64, types.int64, out, types.int64, types.int64), codegen


@intrinsic
def transpose_mins(typingctx: Any, array: Any, index: Any, stride: Any, out: Any, out_index: Any, step: Any) -> Any:
    """The eight uint8 at index + r * stride (r < 8) as four int16x16 from out_index of a flat int16 array, `step`
    elements apart: vector h holds row r's bytes 2h and 2h+1 in lanes 2r and 2r+1 (a quarter's two mins of each
    row)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        rows = []
        for row in range(8):
            pointer = _pointer(context, builder, signature.args[0], args[0], _offset(builder, args[1], args[2], row),
                               ir.VectorType(ir.IntType(8), 8))
            words = builder.zext(builder.load(pointer, align=1), ir.VectorType(_I16, 8))
            pairs = builder.bitcast(words, ir.VectorType(_I32, 4))
            rows.append(builder.shuffle_vector(pairs, pairs, ir.Constant(_V8I32, [0, 1, 2, 3, 0, 1, 2, 3])))
        _store_vectors(context, builder, signature.args[3], args[3], args[4], _transpose8(builder, rows)[:4], args[5])
        return context.get_dummy_value()

    return types.none(array, types.int64, types.int64, out, types.int64, types.int64), codegen


@intrinsic
def prefetch_rows(typingctx: Any, array: Any, index: Any, stride: Any, count: Any) -> Any:
    """Ask for the cache lines at index + r * stride and 64 bytes on (r < count) of a flat uint8 array ahead of their
    use (llvm.prefetch: a hint, never a fault; sixteen rows' super-blocks are more streams than the hardware
    prefetchers follow)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        function = _function(builder, "llvm.prefetch.p0i8", ir.VoidType(),
                             [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
        loop = builder.function.append_basic_block("prefetch_rows")
        done = builder.function.append_basic_block("prefetch_rows_done")
        start = builder.block
        builder.cbranch(builder.icmp_signed(">", args[3], ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        row = builder.phi(_I64)
        row.add_incoming(ir.Constant(_I64, 0), start)
        at = builder.add(args[1], builder.mul(row, args[2]))
        for offset in (0, 64):
            pointer = builder.gep(data, [builder.add(at, ir.Constant(_I64, offset))])
            builder.call(function, [builder.bitcast(pointer, ir.IntType(8).as_pointer()), ir.Constant(_I32, 0),
                                    ir.Constant(_I32, 1), ir.Constant(_I32, 1)])
        following = builder.add(row, ir.Constant(_I64, 1))
        row.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, args[3]), loop, done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return types.none(array, types.int64, types.int64, types.int64), codegen


@intrinsic
def low4(typingctx: Any, octets: Any) -> Any:
    """The low four bits of each byte."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.and_(args[0], _splat(_V32I8, 0x0F))

    return int8x32(int8x32), codegen


@intrinsic
def high4(typingctx: Any, octets: Any) -> Any:
    """The high four bits of each byte, shifted down."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.lshr(args[0], _splat(_V32I8, 4))

    return int8x32(int8x32), codegen


@intrinsic
def with_bits(typingctx: Any, codes: Any, octets: Any, shift: Any, mask: Any) -> Any:
    """codes | ((octets >> shift) & mask) << 4: Q5_K's fifth bit of block `shift` (mask 1) or Q6_K's bits 4-5 (mask
    3; shift and mask are constants once inlined)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        def splat(value: Any) -> Any:
            first = builder.insert_element(ir.Constant(_V32I8, ir.Undefined), builder.trunc(value, ir.IntType(8)),
                                           ir.Constant(_I32, 0))
            return builder.shuffle_vector(first, ir.Constant(_V32I8, ir.Undefined),
                                          ir.Constant(ir.VectorType(_I32, 32), [0] * 32))

        bits = builder.and_(builder.lshr(args[1], splat(args[2])), splat(args[3]))
        return builder.or_(args[0], builder.shl(bits, _splat(_V32I8, 4)))

    return int8x32(int8x32, int8x32, types.int64, types.int64), codegen


@intrinsic
def store_octets(typingctx: Any, array: Any, index: Any, octets: Any) -> Any:
    """Write an int8x32 to a flat uint8 array from `index` on."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.store(args[2], _pointer(context, builder, signature.args[0], args[0], args[1], _V32I8), align=1)
        return context.get_dummy_value()

    return types.none(array, types.int64, int8x32), codegen


@intrinsic
def load_ints(typingctx: Any, array: Any, index: Any) -> Any:
    """The vector at a flat integer array's `index`: an int8x32 from a uint8 array, an int16x16 from an int16 one."""
    octets = array.dtype.bitwidth == 8
    vector, numba_type = (_V32I8, int8x32) if octets else (_V16I16, int16x16)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _pointer(context, builder, signature.args[0], args[0], args[1], vector)
        return builder.load(pointer, align=1 if octets else 2)

    return numba_type(array, types.int64), codegen


@intrinsic
def quad_splat(typingctx: Any, q: Any, index: Any) -> Any:
    """The four int8 of a flat array from `index` on, repeated in all eight lane groups (one x row's four columns
    for every weight row)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _I32), align=1)
        first = builder.insert_element(ir.Constant(_V8I32, ir.Undefined), value, ir.Constant(_I32, 0))
        splat = builder.shuffle_vector(first, ir.Constant(_V8I32, ir.Undefined), ir.Constant(_V8I32, [0] * 8))
        return builder.bitcast(splat, _V32I8)

    return int8x32(q, types.int64), codegen


@intrinsic
def pair_sums(typingctx: Any, codes: Any, values: Any) -> Any:
    """Lane l: codes[2l] * values[2l] + codes[2l+1] * values[2l+1], codes unsigned, values signed (vpmaddubsw; no
    sum here comes near saturation)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if avx2_instructions():
            return builder.call(_function(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8]),
                                [args[0], args[1]])
        wide = ir.VectorType(_I16, 32)
        return _pairs(builder, builder.mul(builder.zext(args[0], wide), builder.sext(args[1], wide)), 16)

    return int16x16(int8x32, int8x32), codegen


@intrinsic
def add16(typingctx: Any, a: Any, b: Any) -> Any:
    """a + b, lane by lane (int16; the callers keep the sums below 32768 in magnitude)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.add(args[0], args[1])

    return int16x16(int16x16, int16x16), codegen


@intrinsic
def scaled_pairs(typingctx: Any, a: Any, scales: Any) -> Any:
    """Lane r: a[2r] * scales[2r] + a[2r+1] * scales[2r+1] (vpmaddwd)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return _maddwd(builder, args[0], args[1])

    return int32x8(int16x16, int16x16), codegen


@intrinsic
def pair_splat(typingctx: Any, sums: Any, index: Any) -> Any:
    """The two int16 of a flat array at `index` and `index + 1`, repeated in all eight lane pairs."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _I32), align=2)
        first = builder.insert_element(ir.Constant(_V8I32, ir.Undefined), value, ir.Constant(_I32, 0))
        splat = builder.shuffle_vector(first, ir.Constant(_V8I32, ir.Undefined), ir.Constant(_V8I32, [0] * 8))
        return builder.bitcast(splat, _V16I16)

    return int16x16(sums, types.int64), codegen


@intrinsic
def octets_zero(typingctx: Any) -> Any:
    """32 zero bytes."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(_V32I8, [0] * 32)

    return int8x32(), codegen


@intrinsic
def words_zero(typingctx: Any) -> Any:
    """Sixteen int16 zeros."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(_V16I16, [0] * 16)

    return int16x16(), codegen


@intrinsic
def izero(typingctx: Any) -> Any:
    """Eight int32 zeros."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(_V8I32, [0] * 8)

    return int32x8(), codegen


@intrinsic
def row_floats(typingctx: Any, array: Any, index: Any, stride: Any) -> Any:
    """A float32x8 of a flat float32 array's elements index + r * stride (r < 8)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        vector = ir.Constant(ir.VectorType(_F32, 8), ir.Undefined)
        for row in range(8):
            value = builder.load(builder.gep(data, [_offset(builder, args[1], args[2], row)]))
            vector = builder.insert_element(vector, value, ir.Constant(_I32, row))
        return vector

    return float32x8(array, types.int64, types.int64), codegen
