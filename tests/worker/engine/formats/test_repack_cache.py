"""The repack cache: built once, mapped read-only after; a truncated or corrupt file is rebuilt, never mapped; a
killed builder's temporary file is cleaned up; two processes starting together on a cold cache end with one file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support.quant_data import random_blocks, random_mxfp4
from tests.support.repack_dir import mapped_from_file
from worker.engine.formats.repack_cache import _HEADER, LAYOUT_VERSION, MAGIC, cached_blocks, model_key
from worker.engine.weights.interleaved_blocks import InterleavedBlocks
from worker.engine.weights.interleaved_k_blocks import InterleavedK
from worker.engine.weights.interleaved_mxfp4 import InterleavedMXFP4
from worker.engine.weights.k_blocks import K_KINDS, KBlocks, decode_k_blocks
from worker.engine.weights.mxfp4_blocks import MXFP4Blocks, decode_mxfp4
from worker.engine.weights.quant_blocks import BlockCodes
from worker.engine.weights.quantized import Blocks, PendingLinear

REPO = Path(__file__).resolve().parents[3]


def pendings(builds: list[str], delay: float = 0.0) -> list[PendingLinear]:
    """Three deterministic projections (bytes codes with offsets, interleaved; groups of 16, kept as block codes;
    4-bit codes with Q4_0's zero point, interleaved half a byte a code) and the K-quant kinds, counting their builds
    in `builds`."""
    out = []
    for i, (rows, cols, group) in enumerate([(8, 64, 32), (16, 32, 16), (4, 256, 32)]):
        def build(i: int = i, rows: int = rows, cols: int = cols, group: int = group) -> BlockCodes:
            builds.append(f"w{i}")
            time.sleep(delay)
            rng = np.random.default_rng(i)
            scale = rng.random((rows, cols // group), dtype=np.float32)
            offset = -8 * scale if i == 2 else rng.random((rows, cols // group), dtype=np.float32)
            return BlockCodes(rng.integers(0, 16 if i == 2 else 64, (rows, cols), dtype=np.uint8), scale, offset, group)
        out.append(PendingLinear(f"w{i}", (rows, cols), group, build))
    for i, kind in enumerate(K_KINDS, start=3):  # the K-quant super-block form
        def build_k(i: int = i, kind: str = kind) -> KBlocks:
            builds.append(f"w{i}")
            return decode_k_blocks(random_blocks(kind, 4, 512, np.random.default_rng(i)), kind, (4, 512))
        out.append(PendingLinear(f"w{i}", (4, 512), 32, build_k))
    return out


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A stand-in model file (the cache keys it by size, mtime and its first and last MiB)."""
    path = tmp_path / "m.gguf"
    path.write_bytes(os.urandom(3000))
    return path


def the_cache_file(directory: Path) -> Path:
    """The one repack file in a directory (and nothing else but its lock file)."""
    files = sorted(p.name for p in directory.iterdir())
    repacks = [name for name in files if name.endswith(".repack")]
    assert len(repacks) == 1 and set(files) == {repacks[0], repacks[0] + ".lock"}, files
    return directory / repacks[0]


def assert_same(found: dict[str, Blocks], expected: dict[str, Blocks]) -> None:
    """Every key's arrays equal."""
    assert found.keys() == expected.keys()
    for key, blocks in expected.items():
        got = found[key]
        if isinstance(blocks, (KBlocks, InterleavedBlocks, InterleavedK)):
            assert type(got) is type(blocks) and got.arrays().keys() == blocks.arrays().keys()
            if isinstance(blocks, InterleavedBlocks):
                assert (got.zero, got.out) == (blocks.zero, blocks.out)  # type: ignore[union-attr]
            else:
                assert got.kind == blocks.kind  # type: ignore[union-attr]
            if isinstance(blocks, InterleavedK):
                assert got.out == blocks.out  # type: ignore[union-attr]
            for name, array in blocks.arrays().items():
                np.testing.assert_array_equal(got.arrays()[name], array)
            continue
        assert isinstance(got, BlockCodes) and got.group == blocks.group
        for name in ("codes", "scale", "offset"):
            np.testing.assert_array_equal(getattr(got, name), getattr(blocks, name))


def arrays(blocks: Blocks) -> list[np.ndarray]:
    """Every array of a matrix in any form."""
    if isinstance(blocks, BlockCodes):
        return [blocks.codes, blocks.scale, blocks.offset]
    return list(blocks.arrays().values())  # type: ignore[union-attr]


def copied(blocks: Blocks) -> Blocks:
    """The same matrix in memory of its own (not a view of a mapping)."""
    if isinstance(blocks, (KBlocks, InterleavedBlocks, InterleavedK)):
        return replace(blocks, **{name: np.array(array) for name, array in blocks.arrays().items()})  # type: ignore
    return BlockCodes(np.array(blocks.codes), np.array(blocks.scale), np.array(blocks.offset), blocks.group)


def test_built_once_then_mapped_read_only(model_file: Path, tmp_path: Path) -> None:
    builds: list[str] = []
    cache = tmp_path / "cache"
    first = cached_blocks(model_file, pendings(builds), cache)
    assert sorted(builds) == [f"w{i}" for i in range(3 + len(K_KINDS))]
    w0, w2 = first["w0"], first["w2"]
    assert isinstance(w0, InterleavedBlocks) and not w0.nibbles and w0.offset is not None and w0.zero == 0
    assert isinstance(w2, InterleavedBlocks) and w2.nibbles and w2.offset is None and w2.zero == 8
    assert w2.codes.shape == (1, 8, 4, 64) and w2.shape == (4, 256)
    kinds = [(type(first[f"w{i}"]).__name__, first[f"w{i}"].kind) for i in range(3, 3 + len(K_KINDS))]  # type: ignore
    assert kinds == [("InterleavedK", kind) for kind in K_KINDS]
    second = cached_blocks(model_file, pendings(builds), cache)
    assert len(builds) == 3 + len(K_KINDS)  # the warm load decoded nothing
    assert_same(second, first)
    codes = second["w1"].codes
    assert mapped_from_file(codes) and codes.dtype == np.uint8 and codes.shape == (16, 32)
    assert model_key(model_file) in the_cache_file(cache).name


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_file_is_rebuilt_not_mapped(model_file: Path, tmp_path: Path, damage: str) -> None:
    builds: list[str] = []
    cache = tmp_path / "cache"
    good = {k: copied(v) for k, v in cached_blocks(model_file, pendings(builds), cache).items()}
    path = the_cache_file(cache)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[200] ^= 0x10  # a bit of the first array's codes
    else:
        data = bytearray(os.urandom(len(data)))
    path.write_bytes(bytes(data))
    builds.clear()
    rebuilt = cached_blocks(model_file, pendings(builds), cache)
    assert sorted(builds) == [f"w{i}" for i in range(3 + len(K_KINDS))]
    assert_same(rebuilt, good)
    assert the_cache_file(cache).stat().st_size > len(data) // 2


def test_a_killed_builders_temporary_file_is_removed(model_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    key = model_key(model_file)
    (cache / f"m.gguf.{key}.repack.tmp.99999").write_bytes(b"half written")
    cached_blocks(model_file, pendings([]), cache)
    the_cache_file(cache)


def test_no_directory_builds_in_memory(model_file: Path) -> None:
    builds: list[str] = []
    found = cached_blocks(model_file, pendings(builds), None)
    assert sorted(builds) == [f"w{i}" for i in range(3 + len(K_KINDS))] and not mapped_from_file(found["w0"].codes)


CHILD = """
import sys, json
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_repack_cache import arrays, pendings
from worker.engine.formats.repack_cache import cached_blocks
builds = []
found = cached_blocks(Path(sys.argv[1]), pendings(builds, delay=0.3), Path(sys.argv[2]))
print(json.dumps({{"builds": len(builds), "sum": sum(int(a.sum()) for b in found.values() for a in arrays(b))}}))
"""


def test_two_processes_on_a_cold_cache_end_with_one_valid_file(model_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    script = CHILD.format(tests=str(Path(__file__).parent))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    children = [subprocess.Popen([sys.executable, "-c", script, str(model_file), str(cache)], env=env,
                                 stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = [child.communicate(timeout=300)[0] for child in children]
    assert all(child.returncode == 0 for child in children)
    import json

    parsed = [json.loads(r.strip().splitlines()[-1]) for r in results]
    assert sorted(p["builds"] for p in parsed) == [0, 3 + len(K_KINDS)]  # one built it; the other waited and mapped it
    assert parsed[0]["sum"] == parsed[1]["sum"]
    builds: list[str] = []
    cached_blocks(model_file, pendings(builds), cache)
    assert builds == []  # the file left behind is valid
    the_cache_file(cache)


def test_a_build_removes_the_same_models_files_of_other_layouts(model_file: Path, tmp_path: Path) -> None:
    """An upgrade's leftovers (this model file's repack files of another layout version) go when a builder writes
    the new one; another model's files, and this model's of the same layout under another key, stay."""
    cache = tmp_path / "cache"
    cache.mkdir()
    old_header = _HEADER.pack(MAGIC, LAYOUT_VERSION - 1, 0, 0, 0, 0)
    leftover = cache / "m.gguf.0123abcd.repack"
    leftover.write_bytes(old_header)
    kept = [cache / "m.gguf.bak.0123abcd.repack", cache / "other.gguf.0123abcd.repack",
            cache / "m.gguf.4567ef.repack"]
    kept[0].write_bytes(old_header)
    kept[1].write_bytes(old_header)
    kept[2].write_bytes(_HEADER.pack(MAGIC, LAYOUT_VERSION, 0, 0, 0, 0))
    cached_blocks(model_file, pendings([]), cache)
    assert not leftover.exists() and all(path.exists() for path in kept)


def test_mxfp4_is_built_once_then_mapped_in_its_interleaved_form(model_file: Path, tmp_path: Path) -> None:
    """An MXFP4 projection (rows scaled) is written as its interleaved arrays and mapped back read-only, equal."""
    builds: list[str] = []

    def build() -> MXFP4Blocks:
        builds.append("m")
        raw = random_mxfp4(20, 64, np.random.default_rng(3))
        return decode_mxfp4(raw, (20, 64)).scaled(np.float32(0.3))

    pending = [PendingLinear("m", (20, 64), 32, build)]
    cache = tmp_path / "cache"
    built = cached_blocks(model_file, pending, None)["m"]
    first = cached_blocks(model_file, pending, cache)["m"]
    second = cached_blocks(model_file, pending, cache)["m"]
    assert builds == ["m", "m"]  # in memory, then once into the cache; the warm load decoded nothing
    for found in (first, second):
        assert isinstance(found, InterleavedMXFP4) and isinstance(built, InterleavedMXFP4) and found.out == 20
        assert found.arrays().keys() == built.arrays().keys() and mapped_from_file(found.codes)
        for name, array in built.arrays().items():
            np.testing.assert_array_equal(found.arrays()[name], array)
            assert found.arrays()[name].dtype == array.dtype
