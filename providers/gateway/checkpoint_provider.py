"""`ResidentProvider`: the gateway side shared by providers whose decisions are worker jobs.

Laya and Von differ only in their engine, their selectors, their checkpoints and which
checkpoint answers a request; the worker runtime and the job are the same, and live here.
Imports no torch, directly or indirectly.
"""

from __future__ import annotations

from typing import ClassVar, Self

from decidealot.providers.gateway.process_runtime import WorkerRuntime

from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest
from decidealot.jobs import EngineSpec, Job
from decidealot.protocols import PreparedRequest


class ResidentProvider:
    """Each decision is one job on this provider's worker (`decidealot.protocols.LocalProvider`)."""

    name: ClassVar[str]
    local = True
    accepts_temperature = False
    prepares_in_lane = False
    engine_factory: ClassVar[str]
    """`module:function` building the engine inside the worker."""
    selectors: ClassVar[tuple[ModelInfo, ...]]
    """The contract's selectors for this provider, in listing order."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime

    @classmethod
    def checkpoints(cls, settings: Settings) -> dict[str, str]:
        """Checkpoint key -> local path, for every checkpoint the worker may serve; the
        service has filled every checkpoint setting (override or installed bundle)."""
        raise NotImplementedError

    @classmethod
    def preload(cls) -> list[str]:
        """Checkpoint keys the worker loads before it reports healthy."""
        return []

    async def checkpoint_for(self, selector: str, request: SystemOneRequest) -> str:
        """The checkpoint key that answers `request` sent to `selector`."""
        raise NotImplementedError

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """A worker runtime for the checkpoints; the runtime resolves `DECIDEALOT_DEVICE` and
        applies the torch thread count."""
        spec = EngineSpec(
            factory=cls.engine_factory,
            checkpoints=cls.checkpoints(settings),
            preload=cls.preload(),
            torch_threads=settings.torch_threads,
            options={"precision": settings.precision},
        )
        return cls(WorkerRuntime(cls.name, spec, settings))

    async def start(self) -> None:
        """Nothing to open: the worker starts when residency first loads it."""

    async def close(self) -> None:
        """Stop the worker if it is still up (residency normally has already)."""
        await self.runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(self.selectors)

    async def prepare(self, selector: str, request: SystemOneRequest) -> PreparedRequest:
        job = Job(
            checkpoint=await self.checkpoint_for(selector, request),
            state=request.state,
            questions=request.questions,
            config=request.config,
        )
        return PreparedRequest(job)
