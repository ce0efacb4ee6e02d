"""`InProcessRuntime`: a local provider's worker host driven in this process, for tests and benches.

The same `Host` a worker process runs (prepare thread, pass planner, compute threads) and the
same `JobChannel` the process runtime answers jobs through, with the pipe replaced by a call:
every frame still goes through msgpack both ways, so what a job carries and what comes back is
exactly what crosses a worker's pipes. There is no watchdog and no process to end, so unloading
stops the host's threads and drops the engine. The gateway never uses it: it imports torch
(through the engine it builds), which is why it sits apart from both sides.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

import msgspec

from decidealot.config import Settings
from decidealot.device import resolve_device, start_frame
from decidealot.errors import ProviderUnavailable
from decidealot.frames import (
    Cancel,
    FromWorker,
    Submit,
    ToWorker,
    decode_from_worker,
    decode_to_worker,
    encode,
)
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.protocols import LocalRuntime
from decidealot.providers.gateway.process_runtime import (
    FAILED_JOB,
    NOT_LOADED,
    STOPPED,
    JobChannel,
)
from decidealot.providers.worker.host import Host, build_engine

log = logging.getLogger("decidealot.worker")


def _over_the_pipe(frame: ToWorker) -> ToWorker:
    return decode_to_worker(encode(frame)[4:])


class InProcessRuntime:
    """A `decidealot.protocols.LocalRuntime` whose worker is this process."""

    def __init__(self, name: str, spec: EngineSpec, settings: Settings) -> None:
        self.name = name
        self.device = resolve_device(settings)
        self._spec = msgspec.structs.replace(
            spec, device=self.device, torch_threads=settings.torch_threads
        )
        self._settings = settings
        self._host: Host | None = None
        self._channel: JobChannel | None = None
        self._job_ids = itertools.count(1)
        self.jobs = 0
        """Jobs submitted so far."""

    @classmethod
    def of(cls, spec: EngineSpec, settings: Settings | None = None) -> InProcessRuntime:
        """A runtime for `spec` alone (named after its factory's module)."""
        name = spec.factory.partition(":")[0].rsplit(".", 2)[-2]
        return cls(name, spec, settings or Settings(device="cpu"))

    @property
    def loaded(self) -> bool:
        return self._host is not None

    @property
    def engine(self) -> object:
        """The engine the host runs (for tests that look inside it)."""
        host = self._host
        if host is None:
            raise ProviderUnavailable(NOT_LOADED)
        return host.engine

    async def load(self, replacing: LocalRuntime | None = None) -> None:
        if replacing is not None:
            await replacing.unload()
        if self._host is not None:
            return
        start = start_frame(self._spec, self._settings)
        engine = await asyncio.to_thread(build_engine, start.spec)
        loop = asyncio.get_running_loop()
        channel = JobChannel(self.name, log.getChild(self.name))

        def emit(frame: FromWorker) -> None:
            answer = decode_from_worker(encode(frame)[4:])  # raises as the pipe's encoder would
            loop.call_soon_threadsafe(channel.deliver, answer)

        host = Host(
            engine, emit, start.batch_token_budget, start.concurrent_passes, start.job_token_limit
        )
        host.start()
        self._host, self._channel = host, channel

    async def unload(self) -> None:
        host, channel = self._host, self._channel
        self._host = self._channel = None
        if host is not None and channel is not None:
            host.stop()
            channel.fail_all(STOPPED)

    async def submit(self, job: Job, sent: Callable[[], None] | None = None) -> Decision:
        host, channel = self._host, self._channel
        if host is None or channel is None:
            raise ProviderUnavailable(NOT_LOADED)
        self.jobs += 1
        job_id = next(self._job_ids)
        try:
            submit = _over_the_pipe(Submit(job_id, job))
        except OverflowError:  # as the process runtime: msgpack holds 64-bit integers
            raise ProviderUnavailable(FAILED_JOB) from None
        assert isinstance(submit, Submit)
        future = channel.open(job_id)
        host.receive(submit)
        try:
            if sent is not None:
                sent()
            return await future
        except asyncio.CancelledError:
            if channel.close(job_id):
                host.receive(Cancel(job_id))
            raise
        finally:
            channel.close(job_id)

    async def __aenter__(self) -> InProcessRuntime:
        await self.load()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unload()
