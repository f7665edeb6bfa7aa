"""What Ollama's /api/tags and /api/show say of a model file, read by the process that has the file.

The gateway never reads model files (it imports no gguf or numpy), so a worker (and a node agent, for the
models of its catalogue) reads them and publishes one JSON object per served model in the `llmfleet:model-facts`
hash (shared/keys.py MODEL_FACTS): the file's size in bytes, its SHA-256 digest, and Ollama's details (format
gguf, family = general.architecture, parameter_size from the tensors' element count as Ollama prints it,
quantization_level from general.file_type) plus the model_info keys /api/show lists.

The digest of a multi-GB file takes seconds to compute, so it is computed once and cached beside the file in
`<file>.sha256` (JSON: sha256, size, mtime_ns); a cache that no longer matches the file's size and mtime is
recomputed; a folder that cannot be written just means the digest is computed again by the next process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from worker.engine.architectures import ARCHITECTURES
from worker.engine.formats.gguf_file import read_metadata, tensor_elements

log = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".sha256"
BLOCK_BYTES = 1 << 20
INFO_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
             "attention.head_count_kv", "vocab_size")  # `{architecture}.{key}` entries of /api/show's model_info


@dataclass(frozen=True)
class ModelFacts:
    """One model file as Ollama describes it."""

    size: int
    digest: str
    family: str
    parameter_size: str
    quantization_level: str
    model_info: dict[str, Any] = field(default_factory=dict)
    format: str = "gguf"
    capabilities: tuple[str, ...] = ("completion", "tools")  # Ollama's: an encoder's are ("embedding",)

    def to_json(self) -> str:
        """The JSON the gateway reads (gateway/ollama/models.py)."""
        return json.dumps(asdict(self), separators=(",", ":"))


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def cached_digest(path: Path) -> str:
    """The file's hex SHA-256 from its cache beside it when that still matches the file, else ""."""
    stat = path.stat()
    try:
        cached = json.loads(_sidecar(path).read_text(encoding="utf-8"))
        if cached.get("size") == stat.st_size and cached.get("mtime_ns") == stat.st_mtime_ns:
            return str(cached["sha256"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    return ""


def file_digest(path: Path) -> str:
    """The file's hex SHA-256, from its cache beside it when that still matches the file, else computed (and
    cached when the folder can be written)."""
    if cached := cached_digest(path):
        return cached
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(BLOCK_BYTES), b""):
            digest.update(block)
    value = digest.hexdigest()
    remember_digest(path, value)
    return value


def remember_digest(path: Path, sha256: str) -> None:
    """Cache a file's digest beside it (one already computed, as `llmfleet pull` verifies it); best effort."""
    stat = path.stat()
    record = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        _sidecar(path).write_text(json.dumps(record), encoding="utf-8")
    except OSError as exc:
        log.info("cannot cache %s's digest beside it (%s)", path.name, type(exc).__name__)


def human_count(count: int) -> str:
    """A parameter count as Ollama prints it: 134.52M, 1.2B, 8B."""
    for scale, suffix, decimals in ((10**9, "B", 1), (10**6, "M", 2), (10**3, "K", 1)):
        if count >= scale:
            number = count / scale
            return f"{number:.0f}{suffix}" if number == int(number) else f"{number:.{decimals}f}{suffix}"
    return str(count)


def quantization_of(metadata: dict[str, Any]) -> str:
    """general.file_type as Ollama names it (Q8_0, Q4_K_M, F16, F32); empty when the file does not say."""
    import gguf

    value = metadata.get("general.file_type")
    try:
        name = gguf.LlamaFileType(int(value)).name  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _capabilities(family: str) -> tuple[str, ...]:
    """What Ollama's /api/show says a model of this architecture can do."""
    return ("embedding",) if getattr(ARCHITECTURES.get(family), "encoder", False) else ("completion", "tools")


def read_facts(path: Path, metadata: dict[str, Any] | None = None, *, hash_file: bool = True) -> ModelFacts:
    """The facts of one GGUF file (its header, its tensors' shapes, its digest); `metadata` as already read (a
    loaded model's); without `hash_file`, only a cached digest ("" when there is none)."""
    metadata = read_metadata(path) if metadata is None else metadata
    parameters = tensor_elements(path)
    family = str(metadata.get("general.architecture", ""))
    info: dict[str, Any] = {"general.architecture": family, "general.parameter_count": parameters,
                            "general.file_type": metadata.get("general.file_type")}
    for key in INFO_KEYS:
        value = metadata.get(f"{family}.{key}")
        if isinstance(value, int | float | str):
            info[f"{family}.{key}"] = value
    digest = file_digest(path) if hash_file else cached_digest(path)
    return ModelFacts(size=path.stat().st_size, digest=digest, family=family,
                      parameter_size=human_count(parameters), quantization_level=quantization_of(metadata),
                      model_info=info, capabilities=_capabilities(family))


def facts_json(path: Path, metadata: dict[str, Any] | None = None, *, hash_file: bool = True) -> str | None:
    """read_facts as JSON, or None (logged) when the file cannot be read."""
    try:
        return read_facts(path, metadata, hash_file=hash_file).to_json()
    except Exception as exc:  # noqa: BLE001 - facts are informational: never fail a worker over them
        log.warning("cannot read the facts of %s: %s", path.name, type(exc).__name__)
        return None


def read_facts_then_digest(path: Path, metadata: dict[str, Any] | None, keep: Callable[[str | None], None]) -> None:
    """Hand `keep` the file's facts from its header now (their parse holds the GIL ~0.1 s: a worker does it before
    it registers, not beside its first requests), and, where no digest is cached beside the file, again with the
    digest from a thread (seconds for a multi-GB file hashed the first time)."""
    facts = facts_json(path, metadata, hash_file=False)
    keep(facts)
    if facts is not None and not json.loads(facts)["digest"]:
        threading.Thread(target=_keep_with_digest, args=(facts, path, keep), name="model-facts", daemon=True).start()


def _keep_with_digest(facts: str, path: Path, keep: Callable[[str | None], None]) -> None:
    """Hand `keep` the header facts (JSON) again with the file's digest, hashed now; a file that cannot be read keeps
    the facts it had (logged)."""
    try:
        digest = file_digest(path)
    except OSError as exc:
        log.warning("cannot hash %s: %s", path.name, type(exc).__name__)
        return
    keep(json.dumps({**json.loads(facts), "digest": digest}, separators=(",", ":")))
