"""Integer vectors for the int8 kernels (int_kernels.py): 32 codes in one AVX register, multiplied into 32 int8
activations with AVX2's `vpmaddubsw` / `vpmaddwd`, or with portable LLVM vector code that gives the same integers
(the 512-bit VNNI vectors of the wide tiles are simd_wide.py's).

An int8x32 holds 32 unsigned codes (0..63); an int16x16 holds sub-scales; an int32x8 holds partial sums (lane l of
a 32-column product is the sum of columns 4l..4l+3). The path is chosen once per process (`int_path`):
"avx512vnni" where the CPU has AVX-512 (F, BW, VL) with VNNI (AVX2 here, and wide_tiles.py's 512-bit tiles for the
wider steps), else "avx2" where it has AVX2, else "generic"; LLMFLEET_INT_KERNELS=avx512vnni|avx2|generic forces
one this CPU has (the tests run each). No sum here can saturate: a code is at most 63 and an activation at most 127
in magnitude, so a pair of products is at most 16002 (< 32767) and vpmaddubsw's saturation never applies; the
generic path therefore equals it exactly.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, models, register_model

from worker.engine.simd import float32x8

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V32I8, _V16I16, _V8I32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
_V16I8, _V8I8 = ir.VectorType(_I8, 16), ir.VectorType(_I8, 8)
_V8F = ir.VectorType(ir.FloatType(), 8)
PATHS = ("avx512vnni", "avx2", "generic")
_NEEDS = {"avx512vnni": ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512vnni"), "avx2": ("avx2",), "generic": ()}


def supported_paths() -> tuple[str, ...]:
    """The paths this CPU can run, fastest first."""
    features = llvm_binding.get_host_cpu_features()
    return tuple(path for path in PATHS if all(features.get(flag) for flag in _NEEDS[path]))


def detected_path() -> str:
    """The path this CPU takes unless forced: the fastest it supports."""
    return supported_paths()[0]


@cache
def int_path() -> str:
    """The integer instruction path of this process: LLMFLEET_INT_KERNELS when set, else detected_path()."""
    forced = os.environ.get("LLMFLEET_INT_KERNELS", "").strip().lower()
    if not forced:
        return detected_path()
    if forced not in supported_paths():
        raise ValueError(f"LLMFLEET_INT_KERNELS={forced!r}: this CPU runs {', '.join(supported_paths())}")
    return forced


def avx2_instructions() -> bool:
    """Whether this process emits AVX2's integer instructions (the avx512vnni path does too)."""
    return int_path() != "generic"


KERNEL_CACHE = int_path() == detected_path()  # numba's on-disk cache is keyed on the CPU, not on
# LLMFLEET_INT_KERNELS: a kernel built for a forced path compiles afresh in each process


def _vector_type(name: str, llvm_type: ir.Type) -> types.Type:
    """A numba type held as one LLVM vector (a type class of its own, with its data model)."""

    class IntVector(types.Type):
        def __init__(self) -> None:
            super().__init__(name=name)

    class IntVectorModel(models.PrimitiveModel):
        def __init__(self, dmm: Any, fe_type: Any) -> None:
            super().__init__(dmm, fe_type, llvm_type)

    IntVector.__name__ = IntVector.__qualname__ = name.capitalize()
    register_model(IntVector)(IntVectorModel)
    return IntVector()


int8x32 = _vector_type("int8x32", _V32I8)  # 32 codes, 0..63
int16x16 = _vector_type("int16x16", _V16I16)  # sub-scales, one per pair of products
int32x8 = _vector_type("int32x8", _V8I32)  # partial sums


def _pointer(context: Any, builder: Any, array_type: Any, array: Any, index: Any, vector: ir.Type) -> Any:
    """A pointer to array's element `index` as a pointer to `vector` (flat, no bounds check)."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), vector.as_pointer())


def _splat(llvm_type: ir.VectorType, value: int) -> ir.Constant:
    """A constant integer vector."""
    return ir.Constant(llvm_type, [value] * llvm_type.count)


def _function(builder: Any, name: str, result: ir.Type, arguments: list[ir.Type]) -> Any:
    """An LLVM intrinsic function declared once per module."""
    module = builder.module
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(result, arguments), name=name)


def _code_bytes(context: Any, builder: Any, array_type: Any, array: Any, index: Any) -> Any:
    """32 bytes of a flat uint8 array from `index` on."""
    return builder.load(_pointer(context, builder, array_type, array, index, _V32I8), align=1)


@intrinsic
def low_nibbles32(typingctx: Any, array: Any, index: Any) -> Any:
    """The low four bits of 32 bytes from `index` on: one block's codes (k_blocks.py's layout)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.and_(_code_bytes(context, builder, signature.args[0], args[0], args[1]), _splat(_V32I8, 0x0F))

    return int8x32(array, index), codegen


@intrinsic
def high_nibbles32(typingctx: Any, array: Any, index: Any) -> Any:
    """The high four bits of 32 bytes from `index` on: the next block's codes."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.lshr(_code_bytes(context, builder, signature.args[0], args[0], args[1]), _splat(_V32I8, 4))

    return int8x32(array, index), codegen


def _byte_splat(builder: Any, value: Any) -> Any:
    """An int64 value's low byte in all 32 lanes (a constant once the kernel is inlined)."""
    first = builder.insert_element(ir.Constant(_V32I8, ir.Undefined), builder.trunc(value, _I8), ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, ir.Constant(_V32I8, ir.Undefined), ir.Constant(ir.VectorType(_I32, 32), [0] * 32))


@intrinsic
def with_high_bits(typingctx: Any, codes: Any, array: Any, index: Any, shift: Any, mask: Any) -> Any:
    """codes | ((byte >> shift) & mask) << 4 for the 32 bytes of `array` from `index` on: Q5_K's fifth bit (mask 1,
    shift the block's number) or Q6_K's bits 4-5 (mask 3, shift twice the block's number in its half)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        octets = _code_bytes(context, builder, signature.args[1], args[1], args[2])
        bits = builder.and_(builder.lshr(octets, _byte_splat(builder, args[3])), _byte_splat(builder, args[4]))
        return builder.or_(args[0], builder.shl(bits, _splat(_V32I8, 4)))

    return int8x32(int8x32, array, index, types.int64, types.int64), codegen


def _pairs(builder: Any, vector: Any, count: int) -> Any:
    """Adjacent lanes summed: (2n,) -> (n,) (0+1, 2+3, ..)."""
    even = builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(_I32, count), list(range(0, 2 * count, 2))))
    odd = builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(_I32, count), list(range(1, 2 * count, 2))))
    return builder.add(even, odd)


@intrinsic
def dot_scaled(typingctx: Any, codes: Any, q: Any, q_index: Any, scales: Any) -> Any:
    """Lane l of the result: scales[2l] * (c0 q0 + c1 q1) + scales[2l+1] * (c2 q2 + c3 q3) over columns 4l..4l+3
    of 32 codes times the 32 int8 of a flat array from `q_index` on (vpmaddubsw then vpmaddwd on AVX2)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        values = builder.load(_pointer(context, builder, signature.args[1], args[1], args[2], _V32I8), align=1)
        if avx2_instructions():
            pairs = builder.call(_function(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8]),
                                 [args[0], values])
        else:
            wide = ir.VectorType(_I16, 32)
            products = builder.mul(builder.zext(args[0], wide), builder.sext(values, wide))  # (32,) exact in int16
            pairs = _pairs(builder, products, 16)  # (16,) at most 16002 in magnitude: no saturation
        return _maddwd(builder, pairs, args[3])

    return int32x8(int8x32, q, q_index, int16x16), codegen


@intrinsic
def isplat16(typingctx: Any, first: Any, second: Any) -> Any:
    """An int16x16 of `first` in lanes 0..7 and `second` in lanes 8..15 (the sub-scales of two 16-column groups)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        vector = ir.Constant(_V16I16, ir.Undefined)
        a, b = builder.trunc(args[0], _I16), builder.trunc(args[1], _I16)
        for lane in range(16):
            vector = builder.insert_element(vector, a if lane < 8 else b, ir.Constant(_I32, lane))
        return vector

    return int16x16(types.int64, types.int64), codegen


@intrinsic
def pair_splats16(typingctx: Any, array: Any, index: Any) -> Any:
    """Eight int16x16 from the 16 int8 at `index`: vector j holds int8 2j in lanes 0..7 and 2j+1 in lanes 8..15 (Q6_K's
    sub-scales: isplat16 of each pair, from one load)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        octets = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _V16I8), align=1)
        words = builder.sext(octets, _V16I16)
        masks = [[2 * j] * 8 + [2 * j + 1] * 8 for j in range(8)]
        splats = [builder.shuffle_vector(words, words, ir.Constant(ir.VectorType(_I32, 16), mask)) for mask in masks]
        return context.make_tuple(builder, signature.return_type, splats)

    return types.UniTuple(int16x16, 8)(array, index), codegen


@intrinsic
def store_splats(typingctx: Any, array: Any, splats: Any) -> Any:
    """Write eight int16x16 to a flat int16 array of at least 128 (a super-block's sub-scales kept in L1 for the x
    rows after it: eight codes and eight scale vectors would need more than AVX2's sixteen registers)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        for j in range(8):
            pointer = builder.bitcast(builder.gep(data, [ir.Constant(ir.IntType(64), 16 * j)]), _V16I16.as_pointer())
            builder.store(builder.extract_value(args[1], j), pointer, align=2)
        return context.get_dummy_value()

    return types.none(array, splats), codegen


@intrinsic
def load_splats(typingctx: Any, array: Any) -> Any:
    """The eight int16x16 store_splats wrote."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        splats = []
        for j in range(8):
            pointer = builder.bitcast(builder.gep(data, [ir.Constant(ir.IntType(64), 16 * j)]), _V16I16.as_pointer())
            splats.append(builder.load(pointer, align=2))
        return context.make_tuple(builder, signature.return_type, splats)

    return types.UniTuple(int16x16, 8)(array), codegen


@intrinsic
def iadd(typingctx: Any, a: Any, b: Any) -> Any:
    """a + b, lane by lane (int32, never near overflow here)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.add(args[0], args[1])

    return int32x8(int32x8, int32x8), codegen


@intrinsic
def ifloat(typingctx: Any, a: Any) -> Any:
    """The eight int32 lanes as float32 (rounded to nearest even past 2**24, as numpy's conversion)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.sitofp(args[0], _V8F)

    return float32x8(int32x8), codegen


def _maddwd(builder: Any, a: Any, b: Any) -> Any:
    """int16x16 a times b, adjacent products summed into int32x8 (vpmaddwd on AVX2; exact here: no input is -32768)."""
    if avx2_instructions():
        return builder.call(_function(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16]), [a, b])
    wide = ir.VectorType(_I32, 16)
    return _pairs(builder, builder.mul(builder.sext(a, wide), builder.sext(b, wide)), 8)


def _hadd(builder: Any, a: Any, b: Any) -> Any:
    """vphaddd's lanes: per 128-bit half, a's adjacent pairs summed, then b's."""
    if avx2_instructions():
        return builder.call(_function(builder, "llvm.x86.avx2.phadd.d", _V8I32, [_V8I32, _V8I32]), [a, b])
    even = builder.shuffle_vector(a, b, ir.Constant(_V8I32, [0, 2, 8, 10, 4, 6, 12, 14]))
    odd = builder.shuffle_vector(a, b, ir.Constant(_V8I32, [1, 3, 9, 11, 5, 7, 13, 15]))
    return builder.add(even, odd)


@intrinsic
def hsum_quarters(typingctx: Any, t0: Any, t1: Any, t2: Any, t3: Any) -> Any:
    """Lane h (h < 4): the sum of t_h's lanes 0..3; lane 4 + h: of its lanes 4..7 (three vphaddd)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return _hadd(builder, _hadd(builder, args[0], args[1]), _hadd(builder, args[2], args[3]))

    return int32x8(int32x8, int32x8, int32x8, int32x8), codegen


@intrinsic
def mins_vector(typingctx: Any, array: Any, index: Any) -> Any:
    """An int16x16 of the eight uint8 at `index` in lanes 0..7 and zeros in lanes 8..15 (Q4_K's mins)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        octets = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _V8I8), align=1)
        words = builder.zext(octets, ir.VectorType(_I16, 8))
        zeros = ir.Constant(ir.VectorType(_I16, 8), [0] * 8)
        return builder.shuffle_vector(words, zeros, ir.Constant(ir.VectorType(_I32, 16), list(range(16))))

    return int16x16(array, index), codegen


@intrinsic
def mins_dot(typingctx: Any, mins: Any, sums: Any, index: Any) -> Any:
    """Lane h (h < 4): m[2h] * sums[index + 2h] + m[2h+1] * sums[index + 2h + 1] of a mins_vector and eight int16
    sums; lanes 4..7 are zero."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _pointer(context, builder, signature.args[1], args[1], args[2], ir.VectorType(_I16, 8))
        words = builder.load(pointer, align=2)
        zeros = ir.Constant(ir.VectorType(_I16, 8), [0] * 8)
        wide = builder.shuffle_vector(words, zeros, ir.Constant(ir.VectorType(_I32, 16), list(range(16))))
        return _maddwd(builder, args[0], wide)

    return int32x8(int16x16, sums, index), codegen


PAIRED_GROUPS = (0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15)  # a super-block's 16-column groups, as paired


@intrinsic
def paired_scales(typingctx: Any, array: Any, index: Any) -> Any:
    """Q6_K's 16 int8 sub-scales at `index`, in PAIRED_GROUPS order, times 32, as an int16x16."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        octets = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _V16I8), align=1)
        paired = builder.shuffle_vector(octets, octets, ir.Constant(ir.VectorType(_I32, 16), list(PAIRED_GROUPS)))
        return builder.shl(builder.sext(paired, _V16I16), _splat(_V16I16, 5))

    return int16x16(array, index), codegen


@intrinsic
def paired_dot(typingctx: Any, scales: Any, sums: Any, index: Any) -> Any:
    """The paired_scales times 16 int16 sums at `index` (also in PAIRED_GROUPS order), as hsum_quarters lays its
    lanes out: lane h the groups 4h and 4h+2, lane 4 + h the groups 4h+1 and 4h+3."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        words = builder.load(_pointer(context, builder, signature.args[1], args[1], args[2], _V16I16), align=2)
        pairs = _maddwd(builder, args[0], words)  # (8,): groups (0,2), (1,3), (4,6), (5,7), ..
        return builder.shuffle_vector(pairs, pairs, ir.Constant(_V8I32, [0, 2, 4, 6, 1, 3, 5, 7]))

    return int32x8(int16x16, sums, index), codegen


@intrinsic
def isub(typingctx: Any, a: Any, b: Any) -> Any:
    """a - b, lane by lane (int32)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.sub(args[0], args[1])

    return int32x8(int32x8, int32x8), codegen

