"""`LayaProvider`: the gateway side of Laya, behind `providers.base.Provider`.

Routes each request to one of three checkpoints (`providers.laya.router`, pure Python), then
runs it as one job on the Laya worker, which hosts all three. Imports no torch, directly or
indirectly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from decidealot.catalog import LOCAL_MODELS
from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest, SystemOneResponse, Usage
from providers.base import JobRunner, LocalRuntime
from providers.engine import EngineSpec, Job
from providers.laya.router import route

if TYPE_CHECKING:
    from decidealot.residency import Residency

ENGINE_FACTORY = "providers.laya.engine:create"
BUNDLES = {
    "english": "laya-english",
    "multilingual": "laya-multilingual",
    "typed-decisions": "laya-typed-decisions",
}
"""Checkpoint key -> bundle name (the directory under the model dir, or its override)."""


class LayaProvider:
    """Local Laya: each decision is one job on the Laya worker, inside its residency slot."""

    name = "laya"
    local = True

    def __init__(self, runner: JobRunner, runtime: LocalRuntime | None = None) -> None:
        self._runner = runner
        self._runtime = runtime

    @classmethod
    def from_settings(cls, settings: Settings, residency: Residency) -> Self:
        """A worker runtime serving all three checkpoints, registered with residency (serial
        lane on CUDA). Nothing is preloaded: the worker loads a checkpoint on its first job, so
        a deployment that only ever routes to one never holds the other two in memory."""
        from decidealot.bundles import checkpoint_path
        from providers.local import ResidentRunner, WorkerRuntime, lane_for

        spec = EngineSpec(
            factory=ENGINE_FACTORY,
            checkpoints={
                key: str(checkpoint_path(settings, bundle)) for key, bundle in BUNDLES.items()
            },
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
        """Route, run, and answer; `model` names the checkpoint that answered."""
        job = Job(
            checkpoint=route(selector, request.state, request.questions),
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
