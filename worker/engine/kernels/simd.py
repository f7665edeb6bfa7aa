"""Eight-lane float32 vectors for numba kernels: a value type held in one AVX register, and its few operations.

numba vectorises simple loops by itself, but not a kernel that keeps several rows' sums in registers across a loop
(the block matmul's: each weight is decoded once and multiplied into four rows). These intrinsics let such a kernel
say so: a `float32x8` is an SSA value of LLVM type <8 x float>, so the sums stay in registers and LLVM emits one
AVX instruction per operation (on CPUs without AVX it splits them; the results are the same). Loads are
unaligned and unchecked: callers index whole, C-contiguous arrays inside their bounds. numba's on-disk cache of
the kernels that use these (cache=True) is keyed on each kernel's own file alone: after changing an intrinsic
here, delete worker/engine/kernels/__pycache__/*.nbi/.nbc (a fresh checkout or image build has none).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, models, register_model

LANES = 8
_F32 = ir.FloatType()
_V8F = ir.VectorType(_F32, LANES)
_I32 = ir.IntType(32)
_STRICT = ("nsz",)  # a flag numba's fastmath pass respects (it adds "fast" only to float instructions with none):
# with it, LLVM may neither reassociate nor contract these operations, whatever the kernel's fastmath setting, so a
# chain of vfma over columns sums in exactly the order written (float_matmul.py's canonical reduction)


class Float32x8(types.Type):
    """numba's type of an eight-lane float32 vector."""

    def __init__(self) -> None:
        super().__init__(name="float32x8")


float32x8 = Float32x8()


@register_model(Float32x8)
class _Float32x8Model(models.PrimitiveModel):
    """Held as LLVM's <8 x float> (one ymm register)."""

    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, _V8F)


def _element_pointer(context: Any, builder: Any, array_type: Any, array: Any, index: Any) -> Any:
    """A pointer to array's element `index` (flat, no bounds check)."""
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [index])


@intrinsic
def vzero(typingctx: Any) -> Any:
    """Eight zeros."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(_V8F, [0.0] * LANES)

    return float32x8(), codegen


@intrinsic
def vload(typingctx: Any, array: Any, index: Any) -> Any:
    """The eight float32 of a flat array from `index` on."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load(builder.bitcast(pointer, _V8F.as_pointer()), align=4)

    return float32x8(array, index), codegen


@intrinsic
def vload_u8(typingctx: Any, array: Any, index: Any) -> Any:
    """The eight uint8 of a flat array from `index` on, as float32."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        octet = builder.load(builder.bitcast(pointer, ir.VectorType(ir.IntType(8), LANES).as_pointer()), align=1)
        return builder.uitofp(builder.zext(octet, ir.VectorType(_I32, LANES)), _V8F)

    return float32x8(array, index), codegen


@intrinsic
def vload_wide(typingctx: Any, array: Any, index: Any) -> Any:
    """The eight elements of a flat float32 array, or of a uint16 array holding float16 bits (widened by
    vcvtph2ps), from `index` on, as float32: one kernel source for both KV pool dtypes."""
    halves = array.dtype == types.uint16

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        if not halves:
            return builder.load(builder.bitcast(pointer, _V8F.as_pointer()), align=4)
        vector = builder.load(builder.bitcast(pointer, ir.VectorType(ir.HalfType(), LANES).as_pointer()), align=2)
        return builder.fpext(vector, _V8F)

    return float32x8(array, index), codegen


@intrinsic
def widen(typingctx: Any, value: Any) -> Any:
    """One element as vload_wide reads it: a float32 as it is, uint16 float16 bits as float32."""
    halves = value == types.uint16

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), _F32) if halves else args[0]

    return types.float32(value), codegen


@intrinsic
def narrow(typingctx: Any, value: Any) -> Any:
    """A float32 as float16 bits (uint16), rounded to nearest even as numpy's astype(np.float16) rounds."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def vbroadcast(typingctx: Any, value: Any) -> Any:
    """One float32 in all eight lanes."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        undefined = ir.Constant(_V8F, ir.Undefined)
        first = builder.insert_element(undefined, args[0], ir.Constant(_I32, 0))
        return builder.shuffle_vector(first, undefined, ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))

    return float32x8(types.float32), codegen


@intrinsic
def vstore(typingctx: Any, array: Any, index: Any, value: Any) -> Any:
    """Write eight float32 into a flat array from `index` on."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(pointer, _V8F.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(array, index, float32x8), codegen


def _lane_operation(name: str, instruction: str, doc: str, vector: types.Type | None = None) -> Any:
    """A two-vector intrinsic applying one LLVM float instruction (fadd, fsub, fmul, fdiv) lane by lane, on
    float32x8 or another float vector type (simd_wide.py's float32x16)."""
    vector = vector or float32x8

    def operation(typingctx: Any, a: Any, b: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return getattr(builder, instruction)(args[0], args[1], flags=_STRICT)

        return vector(vector, vector), codegen

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = doc
    return intrinsic(operation)


vadd = _lane_operation("vadd", "fadd", "a + b, lane by lane.")
vsub = _lane_operation("vsub", "fsub", "a - b, lane by lane.")
vmul = _lane_operation("vmul", "fmul", "a * b, lane by lane.")
vdiv = _lane_operation("vdiv", "fdiv", "a / b, lane by lane.")


@intrinsic
def vfma(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """a * b + c, lane by lane, rounded once (llvm.fma: a fused multiply-add on every CPU, in hardware where it has
    FMA); never split into a multiply and an add, nor reassociated with the sum it feeds."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        module = builder.module
        name = "llvm.fma.v8f32"
        function = module.globals.get(name) or ir.Function(module, ir.FunctionType(_V8F, [_V8F, _V8F, _V8F]), name=name)
        return builder.call(function, [args[0], args[1], args[2]])

    return float32x8(float32x8, float32x8, float32x8), codegen


@intrinsic
def vsum(typingctx: Any, a: Any) -> Any:
    """The sum of the eight lanes, as one float32: (l0+l4 + l2+l6) + (l1+l5 + l3+l7), halving in three strict
    vector adds (always this order)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        vector = args[0]
        width = LANES
        while width > 1:
            width //= 2
            low = builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(_I32, width), list(range(width))))
            high = builder.shuffle_vector(vector, vector,
                                          ir.Constant(ir.VectorType(_I32, width), list(range(width, 2 * width))))
            vector = builder.fadd(low, high, flags=_STRICT)
        return builder.extract_element(vector, ir.Constant(_I32, 0))

    return types.float32(float32x8), codegen


def _splat(value: float) -> ir.Constant:
    """A constant vector of one float32 value."""
    return ir.Constant(_V8F, [value] * LANES)


def _floor(builder: Any, vector: Any) -> Any:
    """llvm.floor on eight lanes."""
    module = builder.module
    name = "llvm.floor.v8f32"
    function = module.globals.get(name) or ir.Function(module, ir.FunctionType(_V8F, [_V8F]), name=name)
    return builder.call(function, [vector])


@intrinsic
def vexp(typingctx: Any, a: Any) -> Any:
    """e**a, lane by lane (Cephes' expf: 2**n times a degree-5 polynomial; relative error about 1e-7; inputs are
    clamped to +-88.38, so exp of a very negative lane is 0 instead of a denormal)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        x = args[0]
        x = builder.select(builder.fcmp_ordered("<", x, _splat(88.3762626647949)), x, _splat(88.3762626647949))
        x = builder.select(builder.fcmp_ordered(">", x, _splat(-88.3762626647949)), x, _splat(-88.3762626647949))
        n = _floor(builder, builder.fadd(builder.fmul(x, _splat(1.44269504088896341)), _splat(0.5)))  # round(x/ln2)
        x = builder.fsub(x, builder.fmul(n, _splat(0.693359375)))  # x - n*ln2, in two parts for precision
        x = builder.fsub(x, builder.fmul(n, _splat(-2.12194440e-4)))
        y = _splat(1.9875691500e-4)
        for coefficient in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            y = builder.fadd(builder.fmul(y, x), _splat(coefficient))
        y = builder.fadd(builder.fadd(builder.fmul(y, builder.fmul(x, x)), x), _splat(1.0))
        int_vector = ir.VectorType(_I32, LANES)
        exponent = builder.add(builder.fptosi(n, int_vector), ir.Constant(int_vector, [127] * LANES))
        two_to_n = builder.bitcast(builder.shl(exponent, ir.Constant(int_vector, [23] * LANES)), _V8F)
        return builder.fmul(y, two_to_n)

    return float32x8(float32x8), codegen
