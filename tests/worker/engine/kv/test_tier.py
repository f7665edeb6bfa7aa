"""The host tier's file (worker/engine/kv/tier.py) without a model: blocks in and out, duplicates, LRU by bytes, and
every fault detected and skipped with one log line: a writer killed mid-write, a torn block, a truncated file, a file
of another layout, a full or read-only directory."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from worker.engine.kv import tier as kv_tier
from worker.engine.kv.tier import TierFile

BLOCK = 6000  # bytes of a block (a slot is 8 KiB: page-aligned)
LAYOUT = {"model": "m", "numerics": 1, "dtype": "float16"}


def _tier(path: Path, slots: int = 8, layout: dict | None = None) -> TierFile:
    return TierFile(path, layout or LAYOUT, BLOCK, 4096 + slots * (8192 + 48) + 4096)


def _block(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)  # (BLOCK,)


def _key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def _read(tier: TierFile, i: int) -> np.ndarray | None:
    slot = tier.valid_slots().get(kv_tier.key_words(_key(i)))
    out = np.empty(BLOCK, np.uint8)  # (BLOCK,)
    return out if slot is not None and tier.get(_key(i), slot, out) else None


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_block_written_by_one_worker_is_read_by_another_and_duplicates_collapse(tmp_path: Path) -> None:
    a, b = _tier(tmp_path / "t.kvtier"), _tier(tmp_path / "t.kvtier")
    assert a.put(_key(1), _block(1))
    assert not b.put(_key(1), _block(1)) and b.stats.duplicates == 1  # the second writer leaves one copy
    got = _read(b, 1)
    assert got is not None and np.array_equal(got, _block(1))
    assert len(b.valid_slots()) == 1 and b.stats.bytes_used == 8192
    assert _read(b, 2) is None


def test_a_short_block_and_a_discarded_one(tmp_path: Path) -> None:
    a, b = _tier(tmp_path / "t.kvtier"), _tier(tmp_path / "t.kvtier")
    short = _block(3)[:1000]  # a partial block's rows: fewer bytes than a slot
    assert a.put(_key(3), short)
    slot = b.valid_slots()[kv_tier.key_words(_key(3))]
    out = np.empty(1000, np.uint8)  # (1000,)
    assert b.get(_key(3), slot, out) and np.array_equal(out, short)
    assert b.discard(_key(3)) and not b.discard(_key(3)) and not a.discard(_key(4))
    assert not a.get(_key(3), slot, out) and a.bytes_used() == 0  # gone for every worker; its slot is free
    assert a.put(_key(3), short)  # and the key can be written again


def test_lru_by_bytes_keeps_the_file_within_its_size(tmp_path: Path) -> None:
    tier = _tier(tmp_path / "t.kvtier", slots=4)
    for i in range(4):
        assert tier.put(_key(i), _block(i))
    assert _read(tier, 0) is not None  # block 0 used again: block 1 is now the least recently used
    for i in range(4, 7):
        assert tier.put(_key(i), _block(i))
    assert tier.stats.evictions == 3
    assert [i for i in range(7) if _read(tier, i) is not None] == [0, 4, 5, 6]
    allocated = os.stat(tier.path).st_blocks * 512
    assert allocated <= tier.total_bytes == os.stat(tier.path).st_size


def test_a_block_whose_bytes_do_not_match_its_checksum_is_skipped_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tier = _tier(tmp_path / "t.kvtier")
    tier.put(_key(1), _block(1))
    tier.put(_key(2), _block(2))
    slot = tier.valid_slots()[kv_tier.key_words(_key(1))]
    with open(tier.path, "r+b") as fh:  # half a block of someone else's bytes: a torn block
        fh.seek(tier.data_offset + slot * tier.slot_bytes)
        fh.write(bytes(BLOCK // 2))
    caplog.set_level(logging.INFO)
    assert _read(tier, 1) is None and _read(tier, 1) is None
    assert _read(tier, 2) is not None
    assert len(_warnings(caplog)) == 1 and "checksum" in _warnings(caplog)[0] and tier.stats.skipped == 2


WRITER = """
import os, sys, time
import numpy as np
from pathlib import Path
from worker.engine.kv.tier import TierFile
real = os.pwrite
def half_then_hang(fd, data, offset):
    real(fd, bytes(memoryview(data)[: len(data) // 2]), offset)
    print("writing", flush=True)
    time.sleep(600)
os.pwrite = half_then_hang
tier = TierFile(Path(sys.argv[1]), {"model": "m", "numerics": 1, "dtype": "float16"}, 6000, int(sys.argv[2]))
tier.put((1).to_bytes(16, "little"), np.full(6000, 7, np.uint8))
"""


def test_a_writer_killed_mid_write_leaves_a_block_that_is_never_read(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.kvtier"
    tier = _tier(path)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(tier.total_bytes)],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    assert writer.stdout is not None and writer.stdout.readline().strip() == b"writing"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert tier.has(_key(1)) and _read(tier, 1) is None  # WRITING forever: not valid, not read
    assert not tier.put(_key(1), _block(1))  # a fresh claim: nobody else writes it meanwhile
    later = time.time() + kv_tier.STALE_WRITE_S + 1
    monkeypatch.setattr(kv_tier.time, "time", lambda: later)  # ... until it is stale
    assert tier.put(_key(1), _block(1)) and np.array_equal(_read(tier, 1), _block(1))


def test_a_truncated_file_is_replaced_at_open_and_skipped_under_a_live_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t.kvtier"
    live = _tier(path)
    live.put(_key(1), _block(1))
    os.truncate(path, live.data_offset + 100)
    caplog.set_level(logging.INFO)
    assert _read(live, 1) is None and not live.put(_key(2), _block(2))  # no SIGBUS: skipped
    assert len(_warnings(caplog)) == 1 and "truncated" in _warnings(caplog)[0]
    fresh = _tier(path)  # the next worker to start replaces it
    assert "truncated" in _warnings(caplog)[-1] and len(_warnings(caplog)) == 2
    assert fresh.valid_slots() == {} and os.stat(path).st_size == fresh.total_bytes
    assert fresh.put(_key(2), _block(2)) and _read(live, 2) is not None  # the live one reopened the new file


def test_a_file_of_another_layout_or_not_a_tier_is_replaced_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t.kvtier"
    _tier(path, layout={**LAYOUT, "numerics": 0}).put(_key(1), _block(1))
    caplog.set_level(logging.INFO)
    tier = _tier(path)
    assert _read(tier, 1) is None and tier.valid_slots() == {}
    assert len(_warnings(caplog)) == 1 and "another format, model layout or size" in _warnings(caplog)[0]
    path.write_bytes(b"garbage" * 100)
    assert _tier(path).valid_slots() == {} and "not a tier file" in _warnings(caplog)[-1]


def test_a_full_directory_stops_this_workers_writes_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    tier = _tier(tmp_path / "t.kvtier")
    tier.put(_key(1), _block(1))

    def full(*_args: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(kv_tier.os, "pwrite", full)
    caplog.set_level(logging.INFO)
    assert not tier.put(_key(2), _block(2)) and not tier.put(_key(3), _block(3))
    assert len(_warnings(caplog)) == 1 and "No space left" in _warnings(caplog)[0]
    assert _read(tier, 1) is not None and not tier.has(_key(2))  # reads go on; the claimed slot is given back


def test_drop_forgets_every_block_and_gives_the_pages_back(tmp_path: Path) -> None:
    tier = _tier(tmp_path / "t.kvtier")
    other = _tier(tmp_path / "t.kvtier")
    for i in range(5):
        tier.put(_key(i), _block(i))
    before = os.stat(tier.path).st_blocks
    other.drop()
    assert tier.valid_slots() == {} and _read(tier, 1) is None
    assert os.stat(tier.path).st_blocks < before and tier.put(_key(1), _block(1))
