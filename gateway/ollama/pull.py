"""Ollama's /api/pull on llmfleet's models: a name `llmfleet pull` knows (worker/models.py KNOWN_MODELS and its
aliases, an optional `:latest` tag dropped), or a live node agent's catalogue id, is pulled with the same code as
`llmfleet pull` (worker.models.pull, in a thread off the event loop) into this gateway host's model cache.
worker.models is imported on the first pull only (it brings numpy): no other gateway path loads worker code.

A stream is Ollama's progress objects: {"status": "pulling manifest"}, then {"status": "pulling <12 hex>",
"digest": "sha256:<hex>"} every PROGRESS_EVERY_S while a download runs (it keeps the line alive; the parts'
sizes are not known before they arrive), that object with "total" and "completed" (the file's size) once it is in the
cache, {"status": "verifying sha256 digest"}, {"status": "writing manifest"} and {"status": "success"}; a
failure after the stream began is a last line {"error": ...}. `stream: false` answers the last object alone (or
the error, a 502). A catalogue id whose source is a file path or an `hf:` name has nothing to pull here (its node
agent resolves it when it loads the model): its stream is the manifest and success lines. An unknown name is a
404 in Ollama's error shape that lists the names that can be pulled. Pulls of one model share one download: a
second request waits for the first's; a client that goes away leaves the download running to the end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cluster.warm_pool import WarmPool
from shared.errors import ModelNotFound, PullFailed

if TYPE_CHECKING:
    from types import ModuleType

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 2.0  # a progress object this often while the download runs
_RUNNING: dict[str, asyncio.Future[Path]] = {}  # known model -> its pull under way on this gateway


def _models() -> ModuleType:
    """worker.models, imported on the first pull only: the gateway loads no worker code (nor numpy) otherwise."""
    import worker.models

    return worker.models


def pull(name: str, *, progress: bool) -> Path:
    """`llmfleet pull`'s code: worker.models.pull (blocking; run it in a thread)."""
    path: Path = _models().pull(name, progress=progress)
    return path


@dataclass(frozen=True)
class PullTarget:
    """What a pull request names: a known model to pull, or a catalogue entry its node resolves itself."""

    name: str
    known: str | None  # the KNOWN_MODELS key to pull; None: nothing to download here


def _known(name: str) -> str | None:
    """The KNOWN_MODELS key a name means (an alias, with or without Ollama's `:latest` tag), if any."""
    models = _models()
    for candidate in (name, name.removesuffix(":latest")):
        key = models.canonical_name(candidate)
        if key in models.KNOWN_MODELS:
            return str(key)
    return None


async def resolve_target(pool: WarmPool, name: str) -> PullTarget:
    """The model a pull names; an unknown one is a 404 that lists the names that can be pulled."""
    known = _known(name)
    if known is not None:
        return PullTarget(name, known)
    catalogue: dict[str, str] = {}
    for node in await pool.nodes():
        catalogue.update(node.catalogue)
    source = catalogue.get(name, catalogue.get(name.removesuffix(":latest")))
    if source is not None:
        return PullTarget(name, _known(source))
    names = ", ".join(sorted(set(_models().KNOWN_MODELS) | set(catalogue)))
    raise ModelNotFound(f"pull model manifest: file does not exist: {name!r} is not a model llmfleet can pull; "
                        f"known models: {names}", param="model")


def _download(known: str) -> asyncio.Future[Path]:
    """The pull of a known model under way on this gateway, started now if none is (a thread runs it)."""
    running = _RUNNING.get(known)
    if running is not None and not running.done():
        return running
    task = asyncio.ensure_future(asyncio.to_thread(pull, known, progress=False))
    _RUNNING[known] = task

    def finished(done: asyncio.Future[Path]) -> None:
        if _RUNNING.get(known) is done:
            del _RUNNING[known]
        if not done.cancelled() and done.exception() is not None:
            log.warning("pull of %s failed: %s", known, type(done.exception()).__name__)

    task.add_done_callback(finished)
    return task


async def _pulled(task: asyncio.Future[Path]) -> Path:
    """The pulled file; a failure is PullFailed (the client's going away does not stop the shared download)."""
    try:
        return await asyncio.shield(task)
    except (_models().ModelResolveError, OSError) as exc:
        raise PullFailed(f"pull failed: {exc}") from None


async def progress(target: PullTarget) -> AsyncIterator[dict[str, Any]]:
    """Ollama's progress objects for one pull, ending with success (a failure raises PullFailed)."""
    yield {"status": "pulling manifest"}
    if target.known is not None:
        known = _models().KNOWN_MODELS[target.known]
        layer = {"status": f"pulling {known.sha256[:12]}", "digest": f"sha256:{known.sha256}"}
        task = _download(target.known)
        while not task.done():
            await asyncio.wait({task}, timeout=PROGRESS_EVERY_S)
            if not task.done():
                yield dict(layer)
        size = (await _pulled(task)).stat().st_size
        yield {**layer, "total": size, "completed": size}
        yield {"status": "verifying sha256 digest"}  # worker.models.pull checked it before it kept the file
        yield {"status": "writing manifest"}
        log.info("pulled %s", target.known)
    yield {"status": "success"}


async def progress_lines(target: PullTarget) -> AsyncIterator[dict[str, Any]]:
    """progress(), with a failure after the stream began as Ollama's last line {"error": ...}."""
    try:
        async for item in progress(target):
            yield item
    except PullFailed as exc:
        yield {"error": exc.message}


async def pull_to_end(target: PullTarget) -> dict[str, Any]:
    """`stream: false`: run the pull to the end; its last object."""
    last: dict[str, Any] = {}
    async for item in progress(target):
        last = item
    return last
