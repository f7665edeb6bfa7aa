"""The instruction path of the integer kernels (interleaved_matmul.py, interleaved_k_matmul.py), chosen once per
process (`int_path`): "avx512vnni" where the CPU has AVX-512 (F, BW, VL) with VNNI (one `vpdpbusd` multiplies four
codes of sixteen rows into four activations), else "avx2" where it has AVX2 (`vpmaddubsw` and `vpmaddwd`), else
"generic" (portable LLVM vector code); LLMFLEET_INT_KERNELS=avx512vnni|avx2|generic forces one this CPU has (the
tests run each). Every path gives the same integers (simd_wide.py says why none saturates). Also the LLVM helpers
the vector intrinsics share: a vector numba type, a pointer into an array, an intrinsic function declaration.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic, models, register_model

_I16, _I32 = ir.IntType(16), ir.IntType(32)
_V8I32 = ir.VectorType(_I32, 8)
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


def _pointer(context: Any, builder: Any, array_type: Any, array: Any, index: Any, vector: ir.Type) -> Any:
    """A pointer to array's element `index` as a pointer to `vector` (flat, no bounds check)."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), vector.as_pointer())


def _function(builder: Any, name: str, result: ir.Type, arguments: list[ir.Type]) -> Any:
    """An LLVM intrinsic function declared once per module."""
    module = builder.module
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(result, arguments), name=name)


@intrinsic
def prefetch(typingctx: Any, array: Any, index: Any) -> Any:
    """Ask for the cache line of array's element `index` (flat) ahead of its use (prefetcht0; a hint that never
    faults, so an index past the array is harmless)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        pointer = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        hint = _function(builder, "llvm.prefetch.p0", ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
        builder.call(hint, [pointer, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])  # read, L1
        return context.get_dummy_value()

    return types.void(array, types.int64), codegen


@njit(inline="always", cache=KERNEL_CACHE)
def prefetch_run(array, start, size):  # pragma: no cover (compiled)
    """Ask for every cache line of array's elements start .. start + size - 1 (flat bytes: a uint8 array)."""
    for line in range(0, size, 64):
        prefetch(array, start + line)
