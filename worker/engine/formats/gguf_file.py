"""Reading GGUF files: metadata as plain Python values, float tensors as arrays, quantized ones left in the file.

The layout (header, key/value metadata, tensor infos, aligned data) is parsed here with `struct` over an
mmap: the `gguf` package's reader builds a numpy view per metadata item, which took ~20 s for Gemma 3's
262k-token vocabulary. Dequantization stays with `gguf.quants`.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from worker.engine.errors import ModelLoadError
from worker.engine.weights.k_blocks import KBlocks, decode_k_blocks, has_k_form
from worker.engine.weights.mxfp4_blocks import MXFP4, MXFP4Blocks, decode_mxfp4
from worker.engine.weights.quant_blocks import BlockCodes, code_group, decode_block_codes

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
                            11: "<q", 12: "<d"}  # GGUF value type -> struct format
_NUMPY_TYPES: dict[str, str] = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4",
                                "I64": "<i8"}  # tensor types stored as plain arrays


@dataclass(frozen=True)
class GGUFContents:
    """Everything the engine needs from a GGUF file."""

    path: str
    metadata: dict[str, Any]
    tensors: dict[str, np.ndarray]  # name -> float32, shape in row-major order (GGUF's ne reversed)
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)  # quantized matrices, undecoded (stacked
    # experts (E, out, in) as one (E * out, in) matrix)
    mapping: mmap.mmap | None = None  # the read-only mapping the views above are of

    def drop_resident_pages(self) -> None:
        """Unmap the file's pages this process has touched (they stay in the page cache, and a view read again
        faults them back): after the quantized tensors were built into the repack cache, the builder holds no
        second copy of the model in its RSS and PSS."""
        if self.mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            with contextlib.suppress(OSError, ValueError):  # (where it fails the pages stay mapped, as before)
                self.mapping.madvise(mmap.MADV_DONTNEED)


@dataclass(frozen=True)
class QuantizedTensor:
    """A quantized matrix as the file stores it: its type name, (rows, cols) and the raw bytes of each row (a 3-D
    tensor of stacked experts is one matrix of all their rows)."""

    kind: str  # e.g. "Q4_K"
    shape: tuple[int, int]  # (out, in)
    data: np.ndarray  # (out, bytes per row) uint8, a view of the read-only mapping

    def decode(self) -> BlockCodes | KBlocks | MXFP4Blocks:
        """The tensor in the engine's form: Q4_K, Q5_K, Q6_K and MXFP4 as the file holds them (k_blocks.py,
        mxfp4_blocks.py), other types as 8-bit codes and per-group tables (quant_blocks.py)."""
        if self.kind == MXFP4:
            return decode_mxfp4(self.data, self.shape)
        if has_k_form(self.kind, self.shape[1]):
            return decode_k_blocks(self.data, self.kind, self.shape)
        codes = decode_block_codes(self.data, self.kind, self.shape)
        assert codes is not None, "read_gguf keeps only tensors with a block form"
        return codes


_U64 = struct.Struct("<Q")


class _Cursor:
    """Sequential little-endian reads from a buffer; any overrun raises struct.error or IndexError."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        """One value of a struct format."""
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        """A GGUF string: u64 length, then UTF-8 bytes."""
        length = self.scalar("<Q")
        end = self.pos + length
        if end > len(self.buffer):
            raise IndexError("string past the end of the file")
        raw = self.buffer[self.pos : end]
        self.pos = end
        return raw.decode("utf-8")

    def value(self, kind: int) -> Any:
        """One metadata value of a GGUF value type (arrays as lists)."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind == _STRING:
                return [self.string() for _ in range(count)]
            if item_kind == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            fmt = _SCALARS[item_kind]
            items = np.frombuffer(self.buffer, np.dtype(fmt[1:]).newbyteorder("<"), count, self.pos)  # (count,)
            self.pos += items.nbytes
            return items.tolist()
        return self.scalar(_SCALARS[kind])

    def skip(self, kind: int) -> None:
        """Move past one metadata value without building it (a header scan that needs only the tensors)."""
        if kind == _STRING:
            length = self.scalar("<Q")  # (not `self.pos += ...`: that would add to the position before the read)
            self.pos += length
        elif kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind == _STRING:  # a vocabulary: a tight loop over the lengths
                buffer, pos, length_at = self.buffer, self.pos, _U64.unpack_from
                for _ in range(count):
                    pos += 8 + length_at(buffer, pos)[0]
                self.pos = pos
            elif item_kind == _ARRAY:
                for _ in range(count):
                    self.skip(item_kind)
            else:
                length = struct.calcsize(_SCALARS[item_kind]) * count
                self.pos += length
        else:
            self.pos += struct.calcsize(_SCALARS[kind])
        if self.pos > len(self.buffer):
            raise IndexError("value past the end of the file")


def _open(path: str | Path) -> mmap.mmap:
    """Map a GGUF file read-only after checking that it exists and has the magic."""
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(p, "no such file")
    with p.open("rb") as fh:
        magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ModelLoadError(p, f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def _parse_metadata(cursor: _Cursor, path: str | Path, *, skip: bool = False) -> tuple[dict[str, Any], int]:
    """Header and key/value metadata; returns the metadata and the tensor count (with `skip`, the values are
    passed over, not built: the metadata returned holds the header's counts only)."""
    cursor.pos = 4
    version = cursor.scalar("<I")
    if version not in (2, 3):
        raise ModelLoadError(path, f"GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = cursor.scalar("<Q"), cursor.scalar("<Q")
    metadata: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
    for _ in range(n_kv):
        key = cursor.string()
        if skip:
            cursor.skip(cursor.scalar("<I"))
        else:
            metadata[key] = cursor.value(cursor.scalar("<I"))
    return metadata, n_tensors


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Read only the key/value metadata of a GGUF file (cheap: tensors stay on disk)."""
    buffer = _open(path)
    try:
        return _parse_metadata(_Cursor(buffer), path)[0]
    except (struct.error, IndexError, KeyError, ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise ModelLoadError(path, f"corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None


def tensor_elements(path: str | Path) -> int:
    """How many weights a GGUF file holds (every tensor's element count; cheap: no tensor data is read)."""
    return sum(tensor_elements_by_type(path).values())


def tensor_elements_by_type(path: str | Path) -> dict[str, int]:
    """How many weights a GGUF file holds per tensor type name ("Q4_K", "F32", ...), from its header only."""
    from gguf.constants import GGMLQuantizationType

    buffer = _open(path)
    try:
        cursor = _Cursor(buffer)
        n_tensors = _parse_metadata(cursor, path, skip=True)[1]
        counts: dict[str, int] = {}
        for _ in range(n_tensors):
            cursor.string()
            dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
            kind = GGMLQuantizationType(cursor.scalar("<I")).name
            cursor.scalar("<Q")
            counts[kind] = counts.get(kind, 0) + int(np.prod(dims, dtype=np.int64))
        return counts
    except (struct.error, IndexError, KeyError, ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise ModelLoadError(path, f"corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None


def _tensor_data(buffer: mmap.mmap, offset: int, dims: list[int], qtype: Any) -> np.ndarray:
    """The raw array of one tensor as gguf.quants.dequantize takes it (bytes per row for quantized types)."""
    from gguf.constants import GGML_QUANT_SIZES

    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_elements = int(np.prod(dims))
    n_bytes = n_elements * type_size // block_size
    if offset + n_bytes > len(buffer):
        raise IndexError("tensor data past the end of the file")
    shape = tuple(reversed(dims))
    if qtype.name in _NUMPY_TYPES:
        return np.frombuffer(buffer, np.dtype(_NUMPY_TYPES[qtype.name]), n_elements, offset).reshape(shape)
    data = np.frombuffer(buffer, np.uint8, n_bytes, offset)  # (bytes,)
    return data.reshape(*shape[:-1], shape[-1] // block_size * type_size)  # (..., bytes per row)


def read_gguf(path: str | Path, keep_quantized: bool = False) -> GGUFContents:
    """Read a GGUF file: float tensors as arrays (F32 as read-only views of the mapping, other types dequantized to
    float32; shape row-major, GGUF's reversed). With keep_quantized, each 2-D or 3-D (stacked experts) tensor of a
    type with a block form (quant_blocks.py) is left undecoded in `quantized`, its bytes a view of the mapping."""
    buffer = _open(path)
    metadata, raw, types = _read_layout(buffer, path)
    tensors: dict[str, np.ndarray] = {}
    quantized: dict[str, QuantizedTensor] = {}
    for name, data in raw.items():
        kept = _kept_quantized(data, types[name]) if keep_quantized else None
        if kept is not None:
            quantized[name] = kept
        else:
            tensors[name] = _decoded(data, types[name], name, path)
    return GGUFContents(path=str(path), metadata=metadata, tensors=tensors, quantized=quantized, mapping=buffer)


def _read_layout(buffer: Any, path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """The metadata, each tensor's bytes (a view of the mapping, shaped by its dims) and its GGML type."""
    import gguf

    cursor = _Cursor(buffer)
    raw: dict[str, np.ndarray] = {}
    types: dict[str, Any] = {}
    try:
        metadata, n_tensors = _parse_metadata(cursor, path)
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
            infos.append((name, dims, cursor.scalar("<I"), cursor.scalar("<Q")))
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cursor.pos // alignment) * alignment
        for name, dims, raw_type, offset in infos:
            try:
                types[name] = gguf.GGMLQuantizationType(raw_type)
            except ValueError:
                raise ModelLoadError(path, f"tensor {name}: unknown type {raw_type}") from None
            raw[name] = _tensor_data(buffer, data_start + offset, dims, types[name])
    except (struct.error, IndexError, KeyError, ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise ModelLoadError(path, f"corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None
    return metadata, raw, types


def _kept_quantized(data: np.ndarray, kind: Any) -> QuantizedTensor | None:
    """A 2-D or 3-D tensor of a type with a block form, left undecoded (its bytes a view); else None."""
    from gguf.constants import GGML_QUANT_SIZES

    if data.ndim not in (2, 3) or kind.name in _NUMPY_TYPES:
        return None
    rows = data.reshape(-1, data.shape[-1])  # (out, bytes) or stacked experts (E * out, bytes)
    cols = rows.shape[1] // GGML_QUANT_SIZES[kind][1] * GGML_QUANT_SIZES[kind][0]
    return QuantizedTensor(kind.name, (rows.shape[0], cols), rows) if code_group(kind.name, cols) is not None else None


def _decoded(data: np.ndarray, kind: Any, name: str, path: str | Path) -> np.ndarray:
    """A tensor as float32: F32 as a read-only view of the mapping (no copy), other types dequantized."""
    from gguf.quants import dequantize

    if kind.name == "F32":
        return data
    shape = data.shape[:-1] + (-1,)
    try:
        array = dequantize(data, kind)
    except NotImplementedError:
        raise ModelLoadError(path, f"tensor {name}: type {kind.name} cannot be dequantized") from None
    except (ValueError, IndexError, TypeError) as exc:
        raise ModelLoadError(path, f"tensor {name}: malformed data ({exc})") from None
    return np.ascontiguousarray(array, dtype=np.float32).reshape(shape)
