"""`ResidentProvider`: the gateway side shared by providers whose decisions are worker jobs.

Laya and Von differ only in their engine, their checkpoints and which checkpoint answers a
request; everything else (the worker runtime and its residency lane, the job, the response)
is the same, and lives here. Imports no torch, directly or indirectly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Self

from decidealot.catalog import LOCAL_MODELS
from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest, SystemOneResponse, Usage
from providers.base import JobRunner, LocalRuntime
from providers.engine import EngineSpec, Job

if TYPE_CHECKING:
    from decidealot.residency import Residency


class ResidentProvider:
    """Each decision is one job on this provider's worker, inside its residency slot."""

    name: ClassVar[str]
    local = True
    engine_factory: ClassVar[str]
    """`module:function` building the engine inside the worker."""

    def __init__(self, runner: JobRunner, runtime: LocalRuntime | None = None) -> None:
        self._runner = runner
        self._runtime = runtime

    @classmethod
    def checkpoints(cls, settings: Settings) -> dict[str, str]:
        """Checkpoint key -> local path, for every checkpoint the worker may serve."""
        raise NotImplementedError

    @classmethod
    def preload(cls) -> list[str]:
        """Checkpoint keys the worker loads before it reports healthy."""
        return []

    def checkpoint_for(self, selector: str, request: SystemOneRequest) -> str:
        """The checkpoint key that answers `request` sent to `selector`."""
        raise NotImplementedError

    @classmethod
    def from_settings(cls, settings: Settings, residency: Residency) -> Self:
        """A worker runtime for the checkpoints, registered with residency on its lane; the
        runtime resolves `DECIDEALOT_DEVICE` and applies the torch thread count."""
        from providers.local import ResidentRunner, WorkerRuntime, lane_for

        spec = EngineSpec(
            factory=cls.engine_factory,
            checkpoints=cls.checkpoints(settings),
            preload=cls.preload(),
            torch_threads=settings.torch_threads,
            options={"precision": settings.precision},
        )
        runtime = WorkerRuntime(cls.name, spec, settings)
        residency.register(runtime, *lane_for(cls.name, runtime.device, settings))
        return cls(ResidentRunner(runtime, residency), runtime)

    async def start(self) -> None:
        """Nothing to open: the worker starts when residency first loads it."""

    async def close(self) -> None:
        """Stop the worker if it is still up (residency normally has already)."""
        if self._runtime is not None:
            await self._runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(LOCAL_MODELS[self.name])

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        """Run the request as one job; `model` names the checkpoint that answered."""
        job = Job(
            checkpoint=self.checkpoint_for(selector, request),
            state=request.state,
            questions=request.questions,
            config=request.config,
        )
        decision = await self._runner.run(job)
        return SystemOneResponse(
            model=decision.model,
            answers=decision.answers,
            usage=Usage(input_tokens=decision.input_tokens),
        )
