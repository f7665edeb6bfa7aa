"""The repack cache: a model's built block codes in one file, memory-mapped read-only, so that every worker of a host
shares one physical copy through the page cache and a warm load decodes nothing.

A file is named by the model file's key and LAYOUT_VERSION. The key is sha256 over the model file's size, its mtime
(ns) and its first and last MiB: a full sha256 of an 8B file (4.6 GB) would take longer than the warm load it serves,
and a changed file (re-pulled, re-quantized) changes its mtime and size or its header. Layout: a header (magic,
version, manifest and data lengths, a checksum of the data), a JSON manifest (the recipe key of every projection,
where its arrays lie, and its form: a K-quant kind, an interleaved super-block matrix's kind and rows, an interleaved
matrix's zero point and rows, or a group) and the arrays, each 64-byte aligned. Before mapping, the size and the
checksum are verified: a truncated or corrupt file is rebuilt, never mapped. A builder holds an exclusive lock (flock
on a side file) and writes a temporary file, fsyncs it and renames it into place: a second worker starting on a cold
cache waits for the lock and then maps the first one's file; a builder killed mid-write leaves only a temporary file,
which the next builder (holding the lock, so no one else is writing) deletes. A builder also deletes the same model
file's repack files of other layout versions (an upgrade's leftovers, unreadable to it). LLMFLEET_REPACK_DIR moves
the cache (default ~/.cache/llmfleet/repack); set it empty to build in memory only. The manifest
names an interleaved MXFP4 matrix's form by its rows (`mxfp4_out`): a form added, no other entry's meaning changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numba import njit, prange

from worker.engine.weights.interleaved_blocks import InterleavedBlocks
from worker.engine.weights.interleaved_k_blocks import InterleavedK
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4
from worker.engine.weights.k_blocks import KBlocks
from worker.engine.weights.quant_blocks import BlockCodes
from worker.engine.weights.quantized import Blocks, PendingLinear, StackedBlocks, build_codes, build_in_memory

LAYOUT_VERSION = 8  # bump whenever codes, tables or a recipe's meaning change (2: 4-bit codes packed two a byte;
# 3: Q4_K and Q6_K in their own super-block form, k_blocks.py; 4: Q5_K too; 5: their code bytes as the file orders
# them; 6: blocks of 32 weights interleaved sixteen rows at a time, interleaved_blocks.py; 7: the K-quants' file
# bytes interleaved the same way, interleaved_k_blocks.py; 8: their d and dmin as float16 where exact)
MAGIC = b"LLMFRPK1"
_HEADER = struct.Struct("<8sIIQQQ")  # magic, layout version, reserved, manifest bytes, data bytes, checksum
_ALIGN = 64
_SAMPLE = 1 << 20  # bytes hashed at each end of the model file
log = logging.getLogger(__name__)


_UNWRITABLE: set[Path] = set()  # cache directories found unwritable (read-only, full) by this process


def note_unwritable(directory: Path, exc: OSError) -> None:
    """Remember that `directory` cannot be written (read-only, full, not a directory): one warning per process
    naming it and the setting; this process keeps what it would write there in memory from now on."""
    if directory in _UNWRITABLE:
        return
    _UNWRITABLE.add(directory)
    log.warning("cache directory %s cannot be written (%s); repacked weights, derived files and measured rates "
                "stay in memory in this process (LLMFLEET_REPACK_DIR: a writable directory, or empty for none)",
                directory, exc.strerror or type(exc).__name__)


def writable(directory: Path) -> bool:
    """False once `directory` was found unwritable by this process (`note_unwritable`)."""
    return directory not in _UNWRITABLE


def cache_dir() -> Path | None:
    """Where repacked files live (LLMFLEET_REPACK_DIR; None when set empty: no cache)."""
    configured = os.environ.get("LLMFLEET_REPACK_DIR")
    if configured is None:
        return Path.home() / ".cache" / "llmfleet" / "repack"
    return Path(configured) if configured else None


def model_key(path: str | Path) -> str:
    """The cache key of a model file: sha256 of its size, mtime and first and last MiB, with the layout version."""
    stat = os.stat(path)
    digest = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}:{LAYOUT_VERSION}".encode())
    with open(path, "rb") as fh:
        digest.update(fh.read(_SAMPLE))
        fh.seek(max(0, stat.st_size - _SAMPLE))
        digest.update(fh.read(_SAMPLE))
    return digest.hexdigest()[:32]


@njit(parallel=True, nogil=True, cache=True)
def _checksum(words):  # pragma: no cover (compiled)
    """A position-weighted sum of 64-bit words (wrapping): any changed, lost or moved word changes it."""
    total = np.uint64(0)
    for i in prange(words.shape[0]):
        total += words[i] * np.uint64(2 * i + 1) + np.uint64(i)
    return total


def checksum(data: np.ndarray) -> int:
    """The checksum of a byte array whose length is a multiple of 8."""
    return int(_checksum(data.view(np.uint64)))


def _pad(n: int) -> int:
    """n rounded up to the alignment."""
    return -(-n // _ALIGN) * _ALIGN


def _write(path: Path, pendings: list[PendingLinear]) -> None:
    """Build every projection, one at a time, into a temporary file; fsync it and rename it to `path`."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    entries: dict[str, dict] = {}
    offset = 0
    with open(tmp, "wb") as fh:
        fh.write(b"\0" * _HEADER.size)
        for pending in pendings:
            if pending.key in entries:
                continue
            entry, offset = _write_entry(fh, build_codes(pending), offset)
            entries[pending.key] = entry
    manifest = json.dumps({"layout": LAYOUT_VERSION, "entries": entries}).encode()
    _finish(tmp, manifest, offset)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_entry(fh: BinaryIO, blocks: Blocks, offset: int) -> tuple[dict, int]:
    """Write one matrix's arrays at `offset` of the data, each aligned; its manifest entry and the next offset."""
    if isinstance(blocks, StackedBlocks):
        parts = []
        for part in blocks.parts:
            entry, offset = _write_entry(fh, part, offset)
            parts.append(entry)
        return {"parts": parts}, offset
    if isinstance(blocks, KBlocks):
        entry: dict = {"kind": blocks.kind}
        arrays = blocks.arrays()
    elif isinstance(blocks, InterleavedK):
        entry, arrays = {"interleaved_kind": blocks.kind, "out": blocks.out}, blocks.arrays()
    elif isinstance(blocks, InterleavedBlocks):
        entry, arrays = {"zero": blocks.zero, "out": blocks.out}, blocks.arrays()
    elif isinstance(blocks, InterleavedMXFP4):
        entry, arrays = {"mxfp4_out": blocks.out}, blocks.arrays()
    else:
        entry = {"group": blocks.group}
        arrays = {name: getattr(blocks, name) for name in ("codes", "scale", "offset")}
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        entry[name] = [offset, str(array.dtype), list(array.shape)]
        fh.write(array.data)
        padded = _pad(offset + array.nbytes)
        fh.write(b"\0" * (padded - offset - array.nbytes))
        offset = padded
    return entry, offset


def _finish(tmp: Path, manifest: bytes, data_bytes: int) -> None:
    """Append the manifest, write the header with the data's checksum, fsync."""
    with open(tmp, "r+b") as fh:
        fh.seek(_HEADER.size + data_bytes)
        fh.write(manifest)
        fh.flush()
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            data = np.frombuffer(mapped, np.uint8, data_bytes, _HEADER.size)  # (data,)
            total = checksum(data)
            del data
        fh.seek(0)
        fh.write(_HEADER.pack(MAGIC, LAYOUT_VERSION, 0, len(manifest), data_bytes, total))
        fh.flush()
        os.fsync(fh.fileno())


def _open_valid(path: Path, keys: set[str]) -> dict[str, Blocks] | None:
    """The cached codes of every key, mapped read-only; None when the file is missing, truncated, corrupt, of
    another layout or lacks a key."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < _HEADER.size:
                return None
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # missing, or unreadable (a path under a file, no permission): built again
        return None
    magic, layout, _, manifest_bytes, data_bytes, total = _HEADER.unpack_from(mapped, 0)
    if magic != MAGIC or layout != LAYOUT_VERSION or size != _HEADER.size + data_bytes + manifest_bytes:
        return None
    if hasattr(mmap, "MADV_HUGEPAGE"):  # huge pages where the kernel backs read-only files with them (fewer TLB
        with contextlib.suppress(OSError):  # misses in the bandwidth-bound decode kernels); harmless elsewhere
            mapped.madvise(mmap.MADV_HUGEPAGE)
    data = np.frombuffer(mapped, np.uint8, data_bytes, _HEADER.size)  # (data,) read-only
    if checksum(data) != total:
        return None
    try:
        entries = json.loads(mapped[_HEADER.size + data_bytes :])["entries"]
        if not keys <= entries.keys():
            return None
        return {key: _entry_codes(data, entries[key]) for key in keys}
    except (ValueError, KeyError, TypeError):
        return None


def _entry_codes(data: np.ndarray, entry: dict) -> Blocks:
    """One projection's arrays as views of the mapped data."""
    if "parts" in entry:
        return StackedBlocks(tuple(_entry_codes(data, part) for part in entry["parts"]))  # type: ignore[misc]
    arrays: dict[str, np.ndarray] = {}
    for name in entry:
        if isinstance(entry[name], list):
            offset, dtype, shape = entry[name]
            count = int(np.prod(shape))
            arrays[name] = np.frombuffer(data, np.dtype(dtype), count, offset).reshape(shape)  # a view, no copy
    if "kind" in entry:
        return KBlocks(kind=str(entry["kind"]), **arrays)
    if "interleaved_kind" in entry:
        return InterleavedK(str(entry["interleaved_kind"]), out=int(entry["out"]), **arrays)
    if "mxfp4_out" in entry:
        return InterleavedMXFP4(out=int(entry["mxfp4_out"]), **arrays)
    if "zero" in entry:
        return InterleavedBlocks(arrays["codes"], arrays["scale"], arrays.get("offset"), int(entry["zero"]),
                                 int(entry["out"]))
    return BlockCodes(arrays["codes"], arrays["scale"], arrays["offset"], int(entry["group"]))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path`'s side lock file (released by the kernel if the holder dies)."""
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _remove_other_layouts(path: Path) -> None:
    """Delete the same model file's repack files of another layout version (what an upgrade leaves: no process of
    this version can read them; one still mapped stays readable to its process until it unmaps it)."""
    model_name = path.name[: -len(".repack")].rsplit(".", 1)[0]
    for other in path.parent.iterdir():
        same_model = other.name.startswith(model_name + ".") and other.name.endswith(".repack")
        if other == path or not same_model or other.name.count(".") != path.name.count("."):  # ("m.gguf.bak")
            continue
        try:
            with open(other, "rb") as fh:
                header = fh.read(_HEADER.size)
            if len(header) == _HEADER.size:
                magic, layout, *_ = _HEADER.unpack(header)
                if magic == MAGIC and layout != LAYOUT_VERSION:
                    other.unlink()
                    log.info("removed %s (repack layout %d; this one is %d)", other.name, layout, LAYOUT_VERSION)
        except OSError:
            continue


def cached_blocks(model_path: str | Path, pendings: list[PendingLinear],
                  directory: Path | None) -> dict[str, Blocks]:
    """Every pending projection's codes: mapped from the repack cache, built into it first when missing or
    invalid; built in memory when there is no cache directory or it cannot be written."""
    keys = {p.key for p in pendings}
    if directory is None or not pendings:  # (a float-only model, BERT's F32/F16: nothing to cache)
        return build_in_memory(pendings)
    path = directory / f"{Path(model_path).name}.{model_key(model_path)}.repack"
    found = _open_valid(path, keys)  # a read-only directory filled beforehand (an image's) is read as well
    if found is not None:
        return found
    if not writable(directory):
        return build_in_memory(pendings)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            found = _open_valid(path, keys)  # another worker may have built it while this one waited
            if found is None:
                for stale in path.parent.glob(path.name + ".tmp.*"):  # a killed builder's (no one else writes now)
                    stale.unlink(missing_ok=True)
                log.info("repacking %s into %s", Path(model_path).name, path)
                _write(path, pendings)
                found = _open_valid(path, keys)
                _remove_other_layouts(path)
    except OSError as exc:
        note_unwritable(directory, exc)
        return build_in_memory(pendings)
    if found is None:
        raise RuntimeError(f"repack cache file {path} failed its own check after writing")
    return found
