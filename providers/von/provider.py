"""`VonProvider`: the gateway side of Von, behind `providers.base.Provider`.

Every Von selector runs the one Von 1.1 checkpoint in a worker process; this module only turns
a validated request into a `Job` and the worker's `Decision` into the response, so it imports no
torch, directly or indirectly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from decidealot.catalog import LOCAL_MODELS
from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest, SystemOneResponse, Usage
from providers.base import JobRunner, LocalRuntime
from providers.engine import EngineSpec, Job

if TYPE_CHECKING:
    from decidealot.residency import Residency

CHECKPOINT = "von-1.1"
"""The one checkpoint key; also the bundle name and the `model` every answer reports."""

ENGINE_FACTORY = "providers.von.engine:create"


class VonProvider:
    """Local Von: each decision is one job on the Von worker, inside its residency slot."""

    name = "von"
    local = True

    def __init__(self, runner: JobRunner, runtime: LocalRuntime | None = None) -> None:
        self._runner = runner
        self._runtime = runtime

    @classmethod
    def from_settings(cls, settings: Settings, residency: Residency) -> Self:
        """A worker runtime for the Von checkpoint, registered with residency (serial lane on
        CUDA). The runtime resolves `DECIDEALOT_DEVICE` and applies the torch thread count."""
        from decidealot.bundles import checkpoint_path
        from providers.local import ResidentRunner, WorkerRuntime, lane_for

        spec = EngineSpec(
            factory=ENGINE_FACTORY,
            checkpoints={CHECKPOINT: str(checkpoint_path(settings, CHECKPOINT))},
            preload=[CHECKPOINT],
            torch_threads=settings.torch_threads,
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
        """Every selector is an alias of the one checkpoint; the answer names the checkpoint."""
        job = Job(
            checkpoint=CHECKPOINT,
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
