"""What a GGUF's weights take in memory once loaded, read from its header alone, and the refusal of a file that
cannot fit: a model larger than the memory the host has available is refused at load with both numbers, before any
tensor is decoded, never OOM-killed mid-load."""

from __future__ import annotations

from pathlib import Path

from worker.engine.errors import ModelLoadError
from worker.engine.formats.gguf_file import tensor_elements_by_type
from worker.engine.weights.quant_blocks import SUPPORTED, held_bytes

F32_BYTES = 4
GIB = 1 << 30


def weights_bytes(path: str | Path) -> int:
    """What the engine holds for a GGUF's weights: the quantized tensors it keeps quantized as that form
    (quant_blocks.held_bytes: 0.59 bytes a weight for Q4_K, 0.83 for Q6_K, 0.625 for Q4_0, 0.75 for Q4_1, 1.125
    for Q5_0 and Q8_0, 1.25 for Q5_1, 0.53 for MXFP4: the repack cache every worker of the host maps), every other
    tensor as float32. ModelLoadError when the header cannot be read."""
    counts = tensor_elements_by_type(path)
    return sum(held_bytes(kind, n) if kind in SUPPORTED else n * F32_BYTES for kind, n in counts.items())


def available_bytes() -> int | None:
    """The memory the host can give without swapping (MemAvailable), or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def refuse_unless_it_fits(path: str | Path, already_mapped: int = 0) -> None:
    """ModelLoadError naming what the file's weights need and what is available, when they do not fit. Bytes of
    this model already resident (its repack file mapped by another worker of the host: `already_mapped`) count as
    available, since loading it again shares them."""
    available = available_bytes()
    if available is None:
        return
    need = weights_bytes(path)
    if need > available + already_mapped:
        raise ModelLoadError(path, f"its weights need {need / GIB:.1f} GiB as the engine holds them and "
                                   f"{(available + already_mapped) / GIB:.1f} GiB is available: refused before "
                                   "loading (free memory or use a smaller quantization)")
