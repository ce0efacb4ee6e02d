"""`InProcessRuntime`: a local provider's worker scheduler in this process, for tests and benches.

The same `Scheduler` a worker process runs (prepare thread, pass planner, compute threads) and the
same `JobChannel` the process runtime answers jobs through, with the pipe replaced by a call:
every frame still goes through msgpack both ways, so what a job carries and what comes back is
exactly what crosses a worker's pipes. There is no watchdog and no process to end, so unloading
stops the scheduler's threads and drops the engine. The gateway never uses it: it imports torch
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
    Loaded,
    Submit,
    ToWorker,
    decode_from_worker,
    decode_to_worker,
    encode,
)
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.protocols import LocalRuntime
from decidealot.providers.gateway.job_channel import FAILED_JOB, JobChannel
from decidealot.providers.gateway.process_runtime import NOT_LOADED, STOPPED
from decidealot.providers.worker.process import build_engine
from decidealot.providers.worker.scheduler import Scheduler

log = logging.getLogger("decidealot.runtime")


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
        self._scheduler: Scheduler | None = None
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
        return self._scheduler is not None

    def checkpoints(self) -> list[Loaded]:
        """How its engine loaded each checkpoint it holds (`protocols.ReportsCheckpoints`)."""
        return [] if self._channel is None else list(self._channel.loads.values())

    @property
    def engine(self) -> object:
        """The engine the scheduler runs (for tests that look inside it)."""
        scheduler = self._scheduler
        if scheduler is None:
            raise ProviderUnavailable(NOT_LOADED)
        return scheduler.engine

    async def load(self, replacing: LocalRuntime | None = None) -> None:
        if replacing is not None:
            await replacing.unload()
        if self._scheduler is not None:
            return
        start = start_frame(self._spec, self._settings)
        engine = await asyncio.to_thread(build_engine, start.spec)
        loop = asyncio.get_running_loop()
        channel = JobChannel(self.name, log.getChild(self.name))

        def emit(frame: FromWorker) -> None:
            answer = decode_from_worker(encode(frame)[4:])  # raises as the pipe's encoder would
            loop.call_soon_threadsafe(channel.deliver, answer)

        scheduler = Scheduler(
            engine, emit, start.batch_token_budget, start.concurrent_passes, start.job_token_limit
        )
        scheduler.start()
        self._scheduler, self._channel = scheduler, channel

    async def unload(self) -> None:
        scheduler, channel = self._scheduler, self._channel
        self._scheduler = self._channel = None
        if scheduler is not None and channel is not None:
            scheduler.stop()
            channel.end(STOPPED)

    async def submit(self, job: Job, sent: Callable[[], None] | None = None) -> Decision:
        scheduler, channel = self._scheduler, self._channel
        if scheduler is None or channel is None:
            raise ProviderUnavailable(NOT_LOADED)
        self.jobs += 1
        job_id = next(self._job_ids)
        try:
            submit = _over_the_pipe(Submit(job_id, job))
        except OverflowError:  # as the process runtime: msgpack holds 64-bit integers
            raise ProviderUnavailable(FAILED_JOB) from None
        assert isinstance(submit, Submit)
        future = channel.open(job_id)
        scheduler.receive(submit)
        try:
            if sent is not None:
                sent()
            return await future
        except asyncio.CancelledError:
            if channel.close(job_id):
                scheduler.receive(Cancel(job_id))
            raise
        finally:
            channel.close(job_id)

    async def __aenter__(self) -> InProcessRuntime:
        await self.load()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unload()
