"""Scale tables in float32 lanes for the interleaved K-quant kernels (interleaved_k_matmul.py,
interleaved_k_single.py): interleaved_k_blocks.py keeps a matrix's d and dmin as float16 bits (uint16) wherever
every value is a float16, else float32, and `wload_scales` reads either form exactly.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from worker.engine.kernels.simd_int import _I16, _pointer
from worker.engine.kernels.simd_wide import _V16F, float32x16


@intrinsic
def wload_scales(typingctx: Any, array: Any, index: Any) -> Any:
    """Sixteen float32 scales of a flat array from `index` on: float32 as they are, or uint16 holding float16 bits
    widened exactly (one vcvtph2ps): interleaved_k_blocks keeps d and dmin as float16 where that is exact."""
    if array.dtype not in (types.float32, types.uint16):
        return None
    half = array.dtype == types.uint16

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if not half:
            return builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _V16F), align=4)
        pointer = _pointer(context, builder, signature.args[0], args[0], args[1], ir.VectorType(_I16, 16))
        halves = builder.bitcast(builder.load(pointer, align=2), ir.VectorType(ir.HalfType(), 16))
        return builder.fpext(halves, _V16F)

    return float32x16(array, types.int64), codegen
