"""Run a non-streaming request's work, but stop it (and so cancel its jobs) if the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientDisconnected.

    Call only after the request body was read: from then on `receive` only reports the disconnect.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself is being cancelled
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
        raise
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    if not task.done():
        task.cancel()  # its `finally` closes the request's jobs, which publishes their cancels
        await asyncio.gather(task, return_exceptions=True)
        if not task.cancelled() and task.exception() is None:
            await _close(task.result())
        raise ClientDisconnected()
    return task.result()


async def _close(result: object) -> None:
    """Close what the work returned although it was cancelled (a cancel that lands as an awaited future completes
    can be lost, e.g. in Python 3.11's asyncio.wait_for): a stream nobody will read still holds running jobs."""
    close = getattr(result, "aclose", None)
    if close is not None:
        await close()
