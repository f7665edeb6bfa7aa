"""A node agent's catalogue: the models it may load (id -> alias, .gguf path or hf: name), and what one
worker of each is estimated to take in memory (weights as the engine holds them, plus its KV pool)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from worker.models import KNOWN_MODELS, cache_dir, canonical_name, model_id

log = logging.getLogger(__name__)

MAX_ENTRIES = 256


class CatalogueError(ValueError):
    """A catalogue entry or file llmfleet cannot use (the message says which)."""


def parse_entry(entry: str) -> tuple[str, str]:
    """`SOURCE` or `ID=SOURCE` -> (model id, source); the id defaults to the name the model is served under."""
    name, sep, source = entry.partition("=")
    if sep and os.sep not in name and name.strip() and source.strip():
        return name.strip(), source.strip()
    entry = entry.strip()
    if not entry:
        raise CatalogueError("an empty catalogue entry")
    return model_id(entry), entry


def read_file(path: Path) -> dict[str, str]:
    """A catalogue file: JSON `{"models": {"id": "source", ...}}` (or a list of `ID=SOURCE` / `SOURCE`)."""
    try:
        raw = json.loads(path.expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CatalogueError(f"catalogue {path}: cannot read it ({type(exc).__name__}: {exc})") from None
    models = raw.get("models") if isinstance(raw, dict) else None
    if isinstance(models, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in models.items()):
        return {k: _relative_to(path, v) for k, v in models.items()}
    if isinstance(models, list) and all(isinstance(v, str) for v in models):
        return dict(parse_entry(v) for v in models)
    raise CatalogueError(f'catalogue {path}: expected {{"models": {{"id": "source", ...}}}}')


def _relative_to(path: Path, source: str) -> str:
    """A relative .gguf path in a catalogue file is relative to the file's folder."""
    if source.endswith(".gguf") and not source.startswith("hf:") and not Path(source).expanduser().is_absolute():
        return str((path.expanduser().resolve().parent / source).resolve())
    return source


def build(entries: list[str], file: str | None = None) -> dict[str, str]:
    """The catalogue of the flags (`--model`, repeatable) and an optional file; ids must be unique."""
    catalogue: dict[str, str] = read_file(Path(file)) if file else {}
    for entry in entries:
        model, source = parse_entry(entry)
        if model in catalogue and catalogue[model] != source:
            raise CatalogueError(f"catalogue: model id {model!r} is given twice ({catalogue[model]} and {source})")
        catalogue[model] = source
    if len(catalogue) > MAX_ENTRIES:
        raise CatalogueError(f"catalogue: {len(catalogue)} models, at most {MAX_ENTRIES}")
    for model in catalogue:
        if not model or len(model) > 200 or any(c.isspace() for c in model):
            raise CatalogueError(f"catalogue: {model!r} is not a usable model id")
    return catalogue


def local_file(source: str) -> Path | None:
    """The model's file if it is already on this machine (a path, or a pulled alias), without downloading."""
    if source.startswith("hf:"):
        return None
    if source.endswith(".gguf") or os.sep in source:
        path = Path(source).expanduser()
        return path if path.is_file() else None
    known = KNOWN_MODELS.get(canonical_name(source))
    if known is None:
        return None
    path = cache_dir() / known.alias / known.filename
    return path if path.is_file() else None


def weights_bytes(path: Path) -> int:
    """What the engine holds for a GGUF's weights (worker.engine.formats.load_budget.weights_bytes); the file's size when its
    header cannot be read."""
    from worker.engine.errors import ModelLoadError
    from worker.engine.formats.load_budget import weights_bytes as held_weights_bytes

    try:
        return held_weights_bytes(path)
    except (ModelLoadError, OSError) as exc:  # a corrupt or foreign file: the worker will say why it cannot load it
        log.info("cannot read %s's tensors (%s); estimating from its size", path.name, type(exc).__name__)
        try:
            return path.stat().st_size
        except OSError:
            return 0


def estimate_bytes(source: str, kv_budget_mib: float) -> int:
    """One worker's estimated memory: its weights (when the file is here) plus its KV pool."""
    path = local_file(source)
    return (weights_bytes(path) if path is not None else 0) + int(kv_budget_mib * 1024 * 1024)


def host_memory_bytes() -> int:
    """The host's RAM (MemTotal), or 8 GiB when it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 << 30
