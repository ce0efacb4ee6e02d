"""A worker subprocess seen from the gateway: its pipes, the jobs in flight on it, and its
stderr forwarded to its owner's log."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Coroutine

from decidealot.frames import Released
from decidealot.providers.gateway.job_channel import JobChannel

STDERR_LINE_LIMIT = 1 << 20
"""The longest stderr line forwarded whole (the stream reader's limit)."""


def background(work: Coroutine[object, object, None]) -> asyncio.Task[None]:
    """A task for the worker's lifetime, outside the context of the request that started it,
    so its log lines do not carry that request's id."""
    return asyncio.create_task(work, context=contextvars.Context())


class WorkerProcess:
    """One worker process and the jobs in flight on it; discarded once it stops, or handed to
    another runtime by `ProcessRuntime.release`."""

    def __init__(
        self, process: asyncio.subprocess.Process, channel: JobChannel, log: logging.Logger
    ) -> None:
        self.process = process
        self.channel = channel
        self.log = log
        """Its owner's logger: the worker's stderr lines go there."""
        self.alive = True
        self.write_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task[None]] = []
        """Its stderr forwarder and frame reader, which end with the process."""
        self.reader: asyncio.Task[None] | None = None
        """The frame reader of its current owner."""
        self.watchdog: asyncio.Task[None] | None = None
        """Sleeps between checks: cancelled when the worker stops."""
        self.released: asyncio.Future[Released | None] | None = None
        """Set while a `Release` awaits its answer (None: the worker went away first)."""

    def adopt(self, channel: JobChannel, log: logging.Logger) -> None:
        """A new owner's: its jobs, its logger."""
        self.channel, self.log = channel, log
        self.alive, self.released = True, None

    async def send(self, frame: bytes) -> None:
        try:
            async with self.write_lock:
                self.process.stdin.write(frame)  # type: ignore[union-attr]
                await self.process.stdin.drain()  # type: ignore[union-attr]
        except ConnectionError:
            pass  # the worker is gone; its reader task fails the futures

    def abandon(self, message: str) -> None:
        """Fail every job in flight and kill the process; its reader task reaps it."""
        self.alive = False
        self.channel.end(message)
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


async def forward_stderr(worker: WorkerProcess) -> None:
    """The worker's stderr into its owner's log, a line per record; lines that start with a
    level name take it, continuation lines (tracebacks) keep the previous one."""
    stderr = worker.process.stderr
    assert stderr is not None
    level = logging.WARNING
    while True:
        try:
            line = await stderr.readline()
        except ValueError:
            worker.log.warning("worker wrote an overlong stderr line; dropped")
            continue
        if not line:
            return
        text = line.decode(errors="replace").rstrip()
        if not text:
            continue
        named = logging.getLevelName(text.split(" ", 1)[0])
        if isinstance(named, int):
            level = named
        worker.log.log(level, "%s", text)
