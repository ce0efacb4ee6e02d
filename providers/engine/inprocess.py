"""`InProcessRuntime`: a local provider's worker loop in a thread of this process, for tests
and benches.

The same client (`WorkerClient`), process loop (`proc.host_engines`) and core a worker process runs,
with the pipes replaced by two queues: every frame still crosses msgpack both ways, so what a job
carries and what comes back is exactly what crosses a worker's pipes. A thread cannot be killed:
a lost or stopped one ends at its next read, once its pass is done. It imports torch (through
the engine it builds), which is why the gateway never uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading

from decidealot.providers.engine.client import ProcessRuntime, WorkerClient
from decidealot.providers.engine.proc import host_engines
from decidealot.providers.engine.protocol import FromWorker, ToWorker, decode_to_worker, encode


class ThreadLink:
    """`client.Link` to `proc.host_engines` running in a thread."""

    stderr = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._loop = asyncio.get_running_loop()
        self._inbox: queue.SimpleQueue[ToWorker | None] = queue.SimpleQueue()
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._code = 0
        self._thread = threading.Thread(target=self._host, name="in-process worker", daemon=True)
        self._thread.start()

    def _host(self) -> None:
        self._code = host_engines(self._inbox.get, self._emit)
        self._post(None)

    def _emit(self, frame: FromWorker) -> None:
        self._post(encode(frame)[4:])  # raises, as the pipe's writer does, for what it cannot carry

    def _post(self, payload: bytes | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads
            self._loop.call_soon_threadsafe(self._outbox.put_nowait, payload)

    async def send(self, frame: bytes) -> None:
        self._inbox.put(decode_to_worker(frame[4:]))

    async def receive(self) -> bytes | None:
        return await self._outbox.get()

    def kill(self) -> None:
        self._inbox.put(None)

    async def wait(self) -> int:
        await asyncio.to_thread(self._thread.join)
        return self._code

    async def close(self, kill: bool) -> None:
        self.kill()
        await self.wait()

    def moving(self) -> bool:
        return False


class InProcessRuntime(ProcessRuntime):
    """A `decidealot.protocols.LocalRuntime` whose worker is a thread of this process."""

    async def _spawn(self) -> WorkerClient:
        return WorkerClient(ThreadLink(), self._settings, self._log)
