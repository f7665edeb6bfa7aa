"""Reading GGUF files: metadata as plain Python values, tensors dequantized once to float32."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.engine.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFContents:
    """Everything the engine needs from a GGUF file."""

    path: str
    metadata: dict[str, Any]
    tensors: dict[str, np.ndarray]  # name -> float32, shape in row-major order (GGUF's ne reversed)


def _open_reader(path: str | Path) -> Any:
    """Open a GGUFReader, turning every low-level failure into a ModelLoadError."""
    import gguf

    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(p, "no such file")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(p, f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(str(p), "r")
    except (ValueError, IndexError, OSError, KeyError, TypeError, OverflowError) as exc:
        raise ModelLoadError(p, f"corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None


def _field_value(field: Any) -> Any:
    """Convert one reader field to a plain Python value (str, int, float, bool or list)."""
    value = field.contents()
    if isinstance(value, np.generic):
        return value.item()
    return value


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Read only the key/value metadata of a GGUF file (cheap: tensors stay on disk)."""
    reader = _open_reader(path)
    return _metadata_of(reader, path)


def _metadata_of(reader: Any, path: str | Path) -> dict[str, Any]:
    """Collect a reader's metadata into a dict."""
    try:
        return {name: _field_value(field) for name, field in reader.fields.items()}
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise ModelLoadError(path, f"unreadable metadata ({type(exc).__name__}: {exc})") from None


def read_gguf(path: str | Path) -> GGUFContents:
    """Read a GGUF file and dequantize every tensor to float32 (row-major, GGUF shape reversed)."""
    import gguf
    from gguf.quants import dequantize

    reader = _open_reader(path)
    metadata = _metadata_of(reader, path)
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        try:
            qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
            data = dequantize(tensor.data, qtype)
        except NotImplementedError:
            raise ModelLoadError(path, f"tensor {tensor.name}: type {tensor.tensor_type!r} cannot be dequantized") from None
        except (ValueError, IndexError, TypeError) as exc:
            raise ModelLoadError(path, f"tensor {tensor.name}: truncated or malformed data ({exc})") from None
        array = np.ascontiguousarray(data, dtype=np.float32)
        if array.size != int(np.prod(shape)):
            raise ModelLoadError(path, f"tensor {tensor.name}: {array.size} values for shape {shape}")
        tensors[tensor.name] = array.reshape(shape)
    return GGUFContents(path=str(path), metadata=metadata, tensors=tensors)
