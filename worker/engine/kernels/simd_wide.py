"""512-bit vectors across sixteen weight rows, for the interleaved kernels (interleaved_matmul.py,
interleaved_k_matmul.py): lane group r of an int8x64 (bytes 4r..4r+3), lane r of an int32x16 or a float32x16
belongs to weight row r. On the "avx512vnni" path (simd_int.int_path) a product of codes and one x row's four
activations is one `vpdpbusd` and a sub-scale is applied by `vpdpwssd`. On the "avx2" path `wdot4`
and `wdot4_bytes` take `vpmaddubsw` and `vpmaddwd` on each 256-bit half: exact while a pair of products stays below
32768 (codes below 128 against int8 activations; `wdot4_bytes` splits full bytes into nibbles); the rest, and the
"generic" path, is portable LLVM vector code giving the same integers.
"""

from __future__ import annotations

from typing import Any

from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from worker.engine.kernels.simd import _lane_operation
from worker.engine.kernels.simd_int import (
    _I16,
    _I32,
    _V8I32,
    _function,
    _pointer,
    _vector_type,
    avx2_instructions,
    int_path,
)

llvm_binding.initialize_native_asmparser()  # wdot_words' inline assembly is parsed when a kernel is built
_I8, _F32 = ir.IntType(8), ir.FloatType()
_V64I8, _V32I16, _V16I32 = ir.VectorType(_I8, 64), ir.VectorType(_I16, 32), ir.VectorType(_I32, 16)
_V16F = ir.VectorType(_F32, 16)

int8x64 = _vector_type("int8x64", _V64I8)  # sixteen rows' four codes each
int32x16 = _vector_type("int32x16", _V16I32)  # one int32 (or two int16) per row
float32x16 = _vector_type("float32x16", _V16F)  # one float32 per row


def _vnni() -> bool:
    """Whether this process emits AVX-512 VNNI instructions."""
    return int_path() == "avx512vnni"


def _broadcast_dword(builder: Any, value: Any) -> Any:
    """An i32 in all sixteen lanes."""
    first = builder.insert_element(ir.Constant(_V16I32, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, ir.Constant(_V16I32, ir.Undefined), ir.Constant(_V16I32, [0] * 16))


def _sum_groups(builder: Any, vector: Any, size: int) -> Any:
    """Lane l: the sum of lanes size*l .. size*l + size - 1 (portable code)."""
    count = vector.type.count // size
    total = None
    for offset in range(size):
        part = builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(_I32, count),
                                                                  list(range(offset, vector.type.count, size))))
        total = part if total is None else builder.add(total, part)
    return total


def _vector_load(name: str, llvm_type: ir.VectorType, vector: Any, align: int, doc: str) -> Any:
    """An intrinsic loading one 512-bit vector of a flat array from `index` on (unaligned, unchecked)."""

    def load(typingctx: Any, array: Any, index: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            pointer = _pointer(context, builder, signature.args[0], args[0], args[1], llvm_type)
            return builder.load(pointer, align=align)

        return vector(array, types.int64), codegen

    load.__name__ = load.__qualname__ = name
    load.__doc__ = doc
    return intrinsic(load)


wload_codes = _vector_load("wload_codes", _V64I8, int8x64, 1, "The 64 bytes of a flat uint8 array from `index` on.")
wfload = _vector_load("wfload", _V16F, float32x16, 4, "The sixteen float32 of a flat array from `index` on.")


@intrinsic
def wload_widened(typingctx: Any, array: Any, index: Any) -> Any:
    """The sixteen bytes of a flat uint8 (zero-extended) or int8 (sign-extended) array from `index` on, as int32
    lanes (one vpmovzxbd or vpmovsxbd)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _pointer(context, builder, signature.args[0], args[0], args[1], ir.VectorType(_I8, 16))
        value = builder.load(pointer, align=1)
        return (builder.sext if signature.args[0].dtype.signed else builder.zext)(value, _V16I32)

    return int32x16(array, types.int64), codegen


@intrinsic
def wload_word_pairs(typingctx: Any, array: Any, index: Any) -> Any:
    """The 32 bytes of a flat uint8 array from `index` on, zero-extended to sixteen int16 pairs (vpmovzxbw)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _pointer(context, builder, signature.args[0], args[0], args[1], ir.VectorType(_I8, 32))
        return builder.bitcast(builder.zext(builder.load(pointer, align=1), _V32I16), _V16I32)

    return int32x16(array, types.int64), codegen


@intrinsic
def wstore_codes(typingctx: Any, array: Any, index: Any, value: Any) -> Any:
    """Write 64 bytes to a flat uint8 array from `index` on."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.store(args[2], _pointer(context, builder, signature.args[0], args[0], args[1], _V64I8), align=1)
        return context.get_dummy_value()

    return types.none(array, types.int64, int8x64), codegen


@intrinsic
def wtop_bits(typingctx: Any, nibbles: Any, high: Any, shift: Any, mask: Any) -> Any:
    """Five- or six-bit codes: nibbles | (((high >> shift) & mask) << 4), byte by byte (Q5_K's fifth bit, mask 1, or
    Q6_K's bits 4-5, mask 3, at bit `shift` of a plane; shift and mask are constants where it is inlined)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        def splat(index: int) -> Any:
            value = builder.trunc(context.cast(builder, args[index], signature.args[index], types.int64), _I8)
            first = builder.insert_element(ir.Constant(_V64I8, ir.Undefined), value, ir.Constant(_I32, 0))
            return builder.shuffle_vector(first, ir.Constant(_V64I8, ir.Undefined),
                                          ir.Constant(ir.VectorType(_I32, 64), [0] * 64))

        top = builder.and_(builder.lshr(args[1], splat(2)), splat(3))
        return builder.or_(args[0], builder.shl(top, ir.Constant(_V64I8, [4] * 64)))

    return int8x64(int8x64, int8x64, shift, mask), codegen


@intrinsic
def wquad_splat(typingctx: Any, q: Any, index: Any) -> Any:
    """The four int8 of a flat array from `index` on, repeated for all sixteen rows."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _I32), align=1)
        return builder.bitcast(_broadcast_dword(builder, value), _V64I8)

    return int8x64(q, types.int64), codegen


def _halves(builder: Any, vector: Any) -> tuple[Any, Any]:
    """A <64 x i8> as its two <32 x i8> halves."""
    mask = [ir.Constant(ir.VectorType(_I32, 32), list(range(h * 32, h * 32 + 32))) for h in range(2)]
    return builder.shuffle_vector(vector, vector, mask[0]), builder.shuffle_vector(vector, vector, mask[1])


def _avx2_dot4(builder: Any, codes: Any, values: Any, weight: int) -> Any:
    """Lane r: weight * (the four products of codes and values in bytes 4r..4r+3), by vpmaddubsw then vpmaddwd on
    each 256-bit half; exact while no pair of products passes 32767 (codes below 128 against int8 values)."""
    v32i8 = ir.VectorType(_I8, 32)
    madd_ub = _function(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(_I16, 16), [v32i8, v32i8])
    madd_wd = _function(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [ir.VectorType(_I16, 16)] * 2)
    weights = ir.Constant(ir.VectorType(_I16, 16), [weight] * 16)
    sums = [builder.call(madd_wd, [builder.call(madd_ub, [c, v]), weights])
            for c, v in zip(_halves(builder, codes), _halves(builder, values))]  # two (8,) int32
    return builder.shuffle_vector(sums[0], sums[1], ir.Constant(_V16I32, list(range(16))))


def _portable_dot4(builder: Any, codes: Any, values: Any) -> Any:
    """Lane r: the four products of codes (unsigned) and values (signed) in bytes 4r..4r+3 (portable code)."""
    wide = ir.VectorType(_I32, 64)
    products = builder.mul(builder.zext(codes, wide), builder.sext(values, wide))  # (64,)
    return _sum_groups(builder, products, 4)


def _dpbusd(builder: Any, acc: Any, codes: Any, values: Any) -> Any:
    """acc + the four products per lane, one vpdpbusd."""
    function = _function(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [_V16I32, _V16I32, _V16I32])
    return builder.call(function, [acc, builder.bitcast(codes, _V16I32), builder.bitcast(values, _V16I32)])


@intrinsic
def wdot4(typingctx: Any, acc: Any, codes: Any, values: Any) -> Any:
    """acc + (lane r: the four products of codes (unsigned, below 128) and values (signed) in bytes 4r..4r+3),
    exact: vpdpbusd on the avx512vnni path, vpmaddubsw and vpmaddwd on avx2 (pairs of products stay below 32768)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if _vnni():
            return _dpbusd(builder, args[0], args[1], args[2])
        if avx2_instructions():
            return builder.add(args[0], _avx2_dot4(builder, args[1], args[2], 1))
        return builder.add(args[0], _portable_dot4(builder, args[1], args[2]))

    return int32x16(int32x16, int8x64, int8x64), codegen


@intrinsic
def wdot4_bytes(typingctx: Any, acc: Any, codes: Any, values: Any) -> Any:
    """wdot4 for codes up to 255 (Q8_0's): one vpdpbusd on the avx512vnni path; on avx2 the codes' low and high
    nibbles each through vpmaddubsw (a full byte could saturate its int16 pairs), joined as 16 * high + low."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if _vnni():
            return _dpbusd(builder, args[0], args[1], args[2])
        if avx2_instructions():
            low = builder.and_(args[1], ir.Constant(_V64I8, [0x0F] * 64))
            high = builder.lshr(args[1], ir.Constant(_V64I8, [4] * 64))
            total = builder.add(_avx2_dot4(builder, high, args[2], 16), _avx2_dot4(builder, low, args[2], 1))
            return builder.add(args[0], total)
        return builder.add(args[0], _portable_dot4(builder, args[1], args[2]))

    return int32x16(int32x16, int8x64, int8x64), codegen


def _word_products(builder: Any, a: Any, b: Any) -> Any:
    """Lane r: a's int16 2r * b's 2r + a's 2r+1 * b's 2r+1 (vpmaddwd's sums, portable code)."""
    wide = ir.VectorType(_I32, 32)
    words_a, words_b = builder.bitcast(a, _V32I16), builder.bitcast(b, _V32I16)
    return _sum_groups(builder, builder.mul(builder.sext(words_a, wide), builder.sext(words_b, wide)), 2)


@intrinsic
def wdot_words(typingctx: Any, acc: Any, a: Any, b: Any) -> Any:
    """acc + (lane r: a's int16 pair times b's, summed) (vpdpwssd). With b's high words zero and a's lanes within
    int16, that is acc + a * b exactly."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if _vnni():  # as inline assembly: LLVM splits the intrinsic into vpmaddwd + vpaddd (two uops for one)
            asm = ir.InlineAsm(ir.FunctionType(_V16I32, [_V16I32] * 3), "vpdpwssd $3, $2, $0", "=v,0,v,v")
            return builder.call(asm, [args[0], args[1], args[2]])
        return builder.add(args[0], _word_products(builder, args[1], args[2]))

    return int32x16(int32x16, int32x16, int32x16), codegen


@intrinsic
def wmadd_words(typingctx: Any, a: Any, b: Any) -> Any:
    """Lane r: a's int16 pair times b's, summed (vpmaddwd; exact here: no input is -32768)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if _vnni():
            function = _function(builder, "llvm.x86.avx512.pmaddw.d.512", _V16I32, [_V32I16, _V32I16])
            return builder.call(function, [builder.bitcast(args[0], _V32I16), builder.bitcast(args[1], _V32I16)])
        return _word_products(builder, args[0], args[1])

    return int32x16(int32x16, int32x16), codegen


def _int_operation(name: str, instruction: str, doc: str) -> Any:
    """A two-vector int32x16 intrinsic applying one LLVM integer instruction lane by lane."""

    def operation(typingctx: Any, a: Any, b: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return getattr(builder, instruction)(args[0], args[1])

        return int32x16(int32x16, int32x16), codegen

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = doc
    return intrinsic(operation)


wadd = _int_operation("wadd", "add", "a + b, lane by lane (int32).")
wsub = _int_operation("wsub", "sub", "a - b, lane by lane (int32).")
wshl = _int_operation("wshl", "shl", "a << b, lane by lane (int32; a constant b is one vpslld).")


@intrinsic
def wlow_words(typingctx: Any, a: Any) -> Any:
    """The low int16 of each int32 lane, the high one cleared (a & 0xFFFF: a signed sub-scale for wdot_words)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.and_(args[0], ir.Constant(_V16I32, [0xFFFF] * 16))

    return int32x16(int32x16), codegen


@intrinsic
def wzero(typingctx: Any) -> Any:
    """Sixteen int32 zeros."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(_V16I32, [0] * 16)

    return int32x16(), codegen


@intrinsic
def wsplat(typingctx: Any, value: Any) -> Any:
    """An integer (int32 range) in all sixteen lanes."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return _broadcast_dword(builder, builder.trunc(context.cast(builder, args[0], signature.args[0], types.int64),
                                                       _I32))

    return int32x16(value), codegen


@intrinsic
def wsplat_at(typingctx: Any, array: Any, index: Any) -> Any:
    """The int32 of a flat int32 array at `index` in all sixteen lanes: one broadcast load, without the bounds and
    negative-index arithmetic of an indexed read (which made Q6_K's inner loop 166 instructions instead of 104)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return _broadcast_dword(builder, builder.load(_pointer(context, builder, signature.args[0], args[0], args[1],
                                                               _I32), align=4))

    return int32x16(array, types.int64), codegen


def _nibble_operation(name: str, shift: int, doc: str) -> Any:
    """An int8x64 intrinsic keeping four bits of every byte (from bit `shift` on)."""

    def operation(typingctx: Any, codes: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value = args[0]
            if shift:
                value = builder.lshr(value, ir.Constant(_V64I8, [shift] * 64))
            return builder.and_(value, ir.Constant(_V64I8, [0x0F] * 64))

        return int8x64(int8x64), codegen

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = doc
    return intrinsic(operation)


wlow4 = _nibble_operation("wlow4", 0, "The low four bits of every byte.")
whigh4 = _nibble_operation("whigh4", 4, "The high four bits of every byte.")


@intrinsic
def wpair_splat(typingctx: Any, sums: Any, index: Any) -> Any:
    """The two int16 of a flat array at `index` and `index + 1`, repeated in all sixteen lane pairs."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _I32), align=2)
        return _broadcast_dword(builder, value)

    return int32x16(sums, types.int64), codegen


wfadd = _lane_operation("wfadd", "fadd", "a + b, lane by lane (float32).", float32x16)
wfmul = _lane_operation("wfmul", "fmul", "a * b, lane by lane (float32).", float32x16)


@intrinsic
def wfma(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """a * b + c, lane by lane, rounded once (llvm.fma, as simd.vfma)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        function = _function(builder, "llvm.fma.v16f32", _V16F, [_V16F, _V16F, _V16F])
        return builder.call(function, [args[0], args[1], args[2]])

    return float32x16(float32x16, float32x16, float32x16), codegen


@intrinsic
def wfloat(typingctx: Any, a: Any) -> Any:
    """The sixteen int32 lanes as float32 (rounded to nearest even, as numpy's conversion)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.sitofp(args[0], _V16F)

    return float32x16(int32x16), codegen


@intrinsic
def wfzero(typingctx: Any) -> Any:
    """Sixteen float32 zeros."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(_V16F, [0.0] * 16)

    return float32x16(), codegen


@intrinsic
def wfbroadcast(typingctx: Any, value: Any) -> Any:
    """A float32 in all sixteen lanes."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = context.cast(builder, args[0], signature.args[0], types.float32)
        first = builder.insert_element(ir.Constant(_V16F, ir.Undefined), value, ir.Constant(_I32, 0))
        return builder.shuffle_vector(first, ir.Constant(_V16F, ir.Undefined), ir.Constant(_V16I32, [0] * 16))

    return float32x16(value), codegen


@intrinsic
def wfstore(typingctx: Any, array: Any, index: Any, value: Any) -> Any:
    """Write sixteen float32 to a flat array from `index` on."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.store(args[2], _pointer(context, builder, signature.args[0], args[0], args[1], _V16F), align=4)
        return context.get_dummy_value()

    return types.none(array, types.int64, float32x16), codegen

