"""The host tier's file: full KV blocks of one model and KV layout, shared by every worker process of a host.

One file per (model file key, KV layout) in LLMFLEET_KV_TIER_DIR (default /dev/shm/llmfleet-kv), at most
LLMFLEET_KV_TIER_MIB. Layout: a 4 KiB header (magic, version, slot size and count, the layout as JSON, then a
change counter and an LRU clock), an index of one 48-byte entry per slot (state, checksum, a claim count that
grows whenever the slot is claimed or the tier dropped, last use, claim time, the 16-byte chain key), then the
slots, 4 KiB aligned.

The index is memory-mapped; block bytes are moved with pread/pwrite, so a full tmpfs is an ENOSPC on a write and a
truncated file a short read, never a SIGBUS. Writers claim a slot (LRU, by bytes: every slot is one block) under an
flock, write the bytes without it, then publish the checksum and VALID under the flock again if the slot is still
theirs; a key already present or being written is not written twice. Readers take no lock: a block is used only if
its state is VALID, its checksum (kernels/block_checksum.py, over key and bytes) matches the bytes read and its claim count did not
change meanwhile, so a block torn by a kill -9 mid-write (left WRITING) or overwritten while read is never used. A
slot left WRITING for STALE_WRITE_S is reclaimed. A file of another version, layout or size, or truncated, is
replaced (temporary file, rename) with one log line. Every problem is logged once per process and skipped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.engine.kernels.block_checksum import block_digest

MAGIC = b"LLMFKVT1"
FORMAT_VERSION = 2  # bump when the header, index, slot format or checksum changes (2: block_checksum, not crc32)
HEADER_BYTES = 4096
_HEAD = struct.Struct("<8sIIQQQI")  # magic, version, reserved, slot bytes, slots, data offset, layout JSON bytes
_COUNTERS = 3072  # offset of the change counter and the LRU clock (u64 each) in the header
PAGE = 4096
EMPTY, WRITING, VALID = 0, 1, 2
STALE_WRITE_S = 30.0  # a slot WRITING this long belongs to a dead writer: it may be claimed again
ENTRY = np.dtype([("state", "<u4"), ("crc", "<u4"), ("claims", "<u8"), ("used", "<u8"), ("claimed", "<f8"),
                  ("k0", "<u8"), ("k1", "<u8")])
log = logging.getLogger(__name__)


@dataclass
class TierStats:
    """What this process did with the tier (counters) and what the file holds (gauges at the last look)."""

    lookups: int = 0  # admissions that asked the tier (sequences)
    hits: int = 0  # of which at least one block came from it
    misses: int = 0  # of which none did
    tokens_hit: int = 0  # prompt tokens whose KV was copied from the tier
    blocks_written: int = 0
    duplicates: int = 0  # blocks not written: present already, or another writer's under way
    evictions: int = 0  # valid blocks this process's writes replaced
    skipped: int = 0  # blocks found torn, unreadable or unwritable
    bytes_used: int = 0  # gauge: bytes of valid blocks in the file
    bytes_total: int = 0  # gauge: the file's slot bytes


def _round(n: int, to: int = PAGE) -> int:
    return -(-n // to) * to


def key_words(key: bytes) -> tuple[int, int]:
    """The two 64-bit words of a 16-byte chain key, as the index stores them."""
    k0, k1 = struct.unpack("<QQ", key)
    return k0, k1


class TierFile:
    """The slots of one tier file; thread-safe (writes from a writer thread, reads from the step's thread)."""

    def __init__(self, path: Path, layout: dict[str, Any], block_bytes: int, size_bytes: int) -> None:
        self.path = path
        self.layout = json.dumps(layout, sort_keys=True).encode()
        self.block_bytes = block_bytes
        self.slot_bytes = _round(block_bytes)
        self.n_slots = (size_bytes - HEADER_BYTES) // (self.slot_bytes + ENTRY.itemsize)
        self.data_offset = _round(HEADER_BYTES + self.n_slots * ENTRY.itemsize)
        while self.n_slots > 0 and self.data_offset + self.n_slots * self.slot_bytes > size_bytes:
            self.n_slots -= 1
            self.data_offset = _round(HEADER_BYTES + self.n_slots * ENTRY.itemsize)
        if self.n_slots < 1:
            raise ValueError(f"a tier of {size_bytes} bytes holds no block of {block_bytes} bytes")
        self.total_bytes = self.data_offset + self.n_slots * self.slot_bytes
        self.stats = TierStats(bytes_total=self.n_slots * self.slot_bytes)
        self._lock = threading.Lock()  # flock is per open file: threads of this process take this first
        self._warned: set[str] = set()
        self.writable = True
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._open()

    # ---- opening, checking, replacing ----------------------------------------------------------------------

    def _header(self) -> bytes:
        head = _HEAD.pack(MAGIC, FORMAT_VERSION, 0, self.slot_bytes, self.n_slots, self.data_offset, len(self.layout))
        return head + self.layout

    def _open(self) -> None:
        """Map the file, creating or replacing it (one log line) when it is absent, foreign or truncated."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            problem = self._problem()
            if problem is not None:
                if problem != "absent":
                    log.warning("KV tier %s: %s; starting it empty", self.path.name, problem)
                self._create()
            fd = os.open(self.path, os.O_RDWR)
        self._close()
        self._fd = fd
        self._map = mmap.mmap(fd, self.data_offset)
        self._counters = np.ndarray((2,), np.uint64, self._map, _COUNTERS)  # change counter, LRU clock
        self._index = np.ndarray((self.n_slots,), ENTRY, self._map, HEADER_BYTES)  # (S,)
        self._ino = os.fstat(fd).st_ino

    def _problem(self) -> str | None:
        """Why the file on disk cannot be used as it is (None: it can)."""
        try:
            size = os.stat(self.path).st_size
            with open(self.path, "rb") as fh:
                head = fh.read(len(self._header()))
        except FileNotFoundError:
            return "absent"
        if head[:8] != MAGIC:
            return "not a tier file"
        if head != self._header():
            return "written for another format, model layout or size"
        if size != self.total_bytes:
            return f"truncated ({size} of {self.total_bytes} bytes)"
        return None

    def _create(self) -> None:
        """Write a fresh file beside the path and rename it into place (a process mapping the old one keeps it)."""
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, self._header().ljust(HEADER_BYTES, b"\0"), 0)
            zeros = bytes(1 << 20)
            for offset in range(HEADER_BYTES, self.data_offset, len(zeros)):  # the index's pages now: ENOSPC here
                os.pwrite(fd, zeros[: self.data_offset - offset], offset)
            os.ftruncate(fd, self.total_bytes)  # the slots stay sparse until written
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)

    def _close(self) -> None:
        if self._map is not None:
            self._counters = self._index = None  # type: ignore[assignment]
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Unmap and close the file (it stays for other workers and the next start)."""
        with self._lock:
            self._close()

    def _usable(self) -> bool:
        """False (one log line) when the file was truncated or replaced under us; a replaced file is reopened."""
        try:
            now = os.stat(self.path)
        except OSError:
            now = None
        if now is not None and now.st_ino == self._ino and now.st_size == self.total_bytes:
            return True
        if now is not None and now.st_ino == self._ino:
            self.warn("truncated", "KV tier %s was truncated under this worker; blocks are skipped until it is "
                      "replaced", self.path.name)
            return False
        try:
            self._open()  # replaced (a dropped or restarted tier) or deleted: open or create the one there now
        except OSError as exc:
            self.warn("reopen", "KV tier %s cannot be reopened (%s); blocks are skipped", self.path.name,
                      exc.strerror or type(exc).__name__)
            return False
        return True

    def warn(self, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Log a problem once per process and kind."""
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, *args, exc_info=exc_info)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """The index lock (thread lock, then flock); yields whether the file is usable."""
        with self._lock:
            if self._map is None:
                yield False
                return
            usable = self._usable()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield usable
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    # ---- the index -----------------------------------------------------------------------------------------

    def _tick(self) -> int:
        self._counters[1] += np.uint64(1)
        return int(self._counters[1])

    def valid_slots(self) -> dict[tuple[int, int], int]:
        """Chain key words -> slot of every VALID block (a snapshot; reads check again)."""
        with self._lock:
            if self._map is None or not self._usable():
                return {}
            index = self._index.copy()  # (S,)
        live = np.nonzero(index["state"] == VALID)[0]
        self.stats.bytes_used = len(live) * self.slot_bytes
        return {(int(index["k0"][i]), int(index["k1"][i])): int(i) for i in live}

    def bytes_used(self) -> int:
        """Bytes of the valid blocks in the file now (a lock-free look)."""
        index = self._index
        return 0 if index is None else int(np.count_nonzero(index["state"] == VALID)) * self.slot_bytes

    def _victim(self) -> int:
        """The slot to write next: an empty one, else the least recently used one not being written."""
        index = self._index
        stale = (index["state"] == WRITING) & (index["claimed"] < time.time() - STALE_WRITE_S)
        open_ = (index["state"] != WRITING) | stale
        used = np.where(open_, index["used"], np.iinfo(np.uint64).max)  # (S,)
        return int(np.argmin(used)) if open_.any() else -1

    # ---- blocks --------------------------------------------------------------------------------------------

    def put(self, key: bytes, data: np.ndarray, replaces: bytes | None = None) -> bool:
        """Store one block's bytes under its chain key, in the slot of the valid block `replaces` when there is one
        (a partial block's newer snapshot), else in the least recently used; False when it was present, under way,
        or not written."""
        if not self.writable:
            return False
        claimed = self._claim(key, replaces)
        if claimed is None:
            return False
        slot, claims = claimed
        crc = block_digest(data, key_words(key))
        if not self._write(slot, claims, data):
            return False
        with self._locked() as usable:
            entry = self._index[slot : slot + 1]
            if not usable or int(entry["claims"][0]) != claims or entry["state"][0] != WRITING:
                return False  # reclaimed as stale meanwhile, or the file went away
            entry["crc"], entry["used"], entry["state"] = crc, self._tick(), VALID
            self._counters[0] += np.uint64(1)
        self.stats.blocks_written += 1
        return True

    def _claim(self, key: bytes, replaces: bytes | None) -> tuple[int, int] | None:
        """A slot marked WRITING for `key` (the valid block of `replaces` when there is one) and its claim count; None
        when the key is there or being written, or the file cannot be locked."""
        k0, k1 = key_words(key)
        with self._locked() as usable:
            if not usable:
                self.stats.skipped += 1
                return None
            index = self._index
            same = (index["k0"] == k0) & (index["k1"] == k1) & (index["state"] != EMPTY)  # (S,)
            if same.any():
                slot = int(np.argmax(same))
                if index["state"][slot] == VALID or index["claimed"][slot] >= time.time() - STALE_WRITE_S:
                    self.stats.duplicates += 1
                    return None
            old = self._slot_of(replaces) if replaces is not None else -1
            slot = old if old >= 0 else self._victim()
            if slot < 0:
                return None
            self.stats.evictions += int(index["state"][slot] == VALID and slot != old)
            entry = index[slot : slot + 1]
            entry["state"], entry["k0"], entry["k1"] = WRITING, k0, k1
            entry["claims"] += np.uint64(1)
            entry["claimed"] = time.time()
            return slot, int(entry["claims"][0])

    def _write(self, slot: int, claims: int, data: np.ndarray) -> bool:
        """The block's bytes into its claimed slot; a failed write stops this worker's writing (reads go on)."""
        try:
            written = os.pwrite(self._fd, data, self.data_offset + slot * self.slot_bytes)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
            return True
        except OSError as exc:
            self.writable = False
            self.warn("write", "KV tier %s cannot be written (%s); this worker stops writing to it (reads go on)",
                      self.path.name, exc.strerror or type(exc).__name__)
            with self._locked():
                if self._map is not None and int(self._index["claims"][slot]) == claims:
                    self._index[slot : slot + 1]["state"] = EMPTY
            self.stats.skipped += 1
            return False

    def get(self, key: bytes, slot: int, out: np.ndarray) -> bool:
        """Read the block of `key` in `slot` into out (block_bytes,) uint8, or a partial block's first bytes; False
        (never torn bytes) if it is not there intact. Threads read at once: the lock is held only to look at the
        index before and after the bytes are read and checked."""
        k0, k1 = key_words(key)
        with self._lock:
            if self._map is None:
                return False
            entry = self._index[slot : slot + 1].copy()
            fd = self._fd
        if entry["state"][0] != VALID or (int(entry["k0"][0]), int(entry["k1"][0])) != (k0, k1):
            return False  # replaced since the snapshot: a miss, not a fault
        try:
            got = os.preadv(fd, [out], self.data_offset + slot * self.slot_bytes)
        except OSError:
            got = -1
        if got != len(out):
            self.stats.skipped += 1
            self.warn("short", "KV tier %s: a block could not be read whole (truncated file?); it is skipped",
                      self.path.name)
            return False
        crc = block_digest(out, (k0, k1))
        with self._lock:
            index = self._index
            if index is None or int(index["claims"][slot]) != int(entry["claims"][0]) or index["state"][slot] != VALID:
                return False  # overwritten while read, or the file closed
            if crc != int(entry["crc"][0]):
                self.stats.skipped += 1
                self.warn("torn", "KV tier %s: a block failed its checksum (torn by a killed writer?); it is skipped "
                          "and prefilled", self.path.name)
                return False
            index[slot : slot + 1]["used"] = self._tick()
        return True

    def has(self, key: bytes) -> bool:
        """Whether a block of this key is present or being written (a lock-free look: writers check again)."""
        k0, k1 = key_words(key)
        index = self._index
        return index is not None and bool(((index["k0"] == k0) & (index["k1"] == k1) & (index["state"] != EMPTY)).any())

    def _slot_of(self, key: bytes) -> int:
        """The slot of the valid block of `key`, or -1 (under the lock)."""
        k0, k1 = key_words(key)
        index = self._index
        same = (index["k0"] == k0) & (index["k1"] == k1) & (index["state"] == VALID)  # (S,)
        return int(np.argmax(same)) if same.any() else -1

    def discard(self, key: bytes) -> bool:
        """Forget the valid block of `key` (a superseded partial snapshot); False when there is none."""
        with self._locked() as usable:
            if not usable or (slot := self._slot_of(key)) < 0:
                return False
            index = self._index
            entry = index[slot : slot + 1]
            entry["state"], entry["used"] = EMPTY, 0
            entry["claims"] += np.uint64(1)
            self._counters[0] += np.uint64(1)
        return True

    def drop(self) -> None:
        """Forget every block (the admin route's drop): index emptied, slot pages given back to the host."""
        with self._locked() as usable:
            if not usable:
                return
            self._index["state"] = EMPTY
            self._index["claims"] += np.uint64(1)
            self._index["used"] = 0
            self._counters[0] += np.uint64(1)
            with contextlib.suppress(OSError):  # freeing the pages: a reader sees short reads (misses) meanwhile
                os.ftruncate(self._fd, self.data_offset)
                os.ftruncate(self._fd, self.total_bytes)
        self.writable = True
        self.stats.bytes_used = 0
