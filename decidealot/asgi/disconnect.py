"""Ending a request's work when its client hangs up.

Once a body has been read, the ASGI `receive` channel has nothing more to say until the client
disconnects, when it says `http.disconnect`. A decision route races its work against that:
the work is cancelled at once (the executor withdraws its waits and its worker job), and the
route answers 499, which only the access log and the metrics see.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from litestar.types import Receive

T = TypeVar("T")

CLIENT_GONE = 499
"""The status the access log records for a request whose client went away (as nginx does)."""


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result, or `ClientGone` (with `work` cancelled) once the client disconnects."""
    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not job.done():
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            if watcher.done():
                raise ClientGone
        watcher.cancel()
    return job.result()
