"""`CheckpointProvider`: a local provider whose every decision is one job on one checkpoint.

Laya and Von differ only in their engine, selectors, checkpoints and which checkpoint answers a
request (Laya routes, Von has one): their descriptors build this class with their own choice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Self

from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest
from decidealot.jobs import EngineSpec, Job
from decidealot.protocols import LocalRuntime
from decidealot.providers.engine.client import ProcessRuntime

ChooseCheckpoint = Callable[[str, SystemOneRequest], Awaitable[str]]
"""(selector, request) -> the checkpoint key that answers it."""


def only(checkpoint: str) -> ChooseCheckpoint:
    """Every selector answered by the one `checkpoint`."""

    async def choose(selector: str, request: SystemOneRequest) -> str:
        return checkpoint

    return choose


class CheckpointProvider:
    """A `LocalProvider`: each decision one job, on the checkpoint `choose` picks for it."""

    local = True
    accepts_temperature = False

    def __init__(
        self,
        name: str,
        runtime: LocalRuntime,
        selectors: tuple[ModelInfo, ...],
        choose: ChooseCheckpoint,
    ):
        self.name = name
        self.runtime = runtime
        self._selectors = selectors
        self._choose = choose

    @classmethod
    def in_worker(
        cls,
        name: str,
        selectors: tuple[ModelInfo, ...],
        factory: str,
        checkpoints: dict[str, Path | None],
        settings: Settings,
        choose: ChooseCheckpoint,
        preload: tuple[str, ...] = (),
        calibrations: dict[str, str] | None = None,
    ) -> Self:
        """Over a worker process running `factory`'s engine on `checkpoints` (key -> path, every
        one filled by the service); `calibrations` (key -> file) replace those checkpoints' own
        confidence rules."""
        options: dict[str, object] = {
            "precision": settings.precision,
            "long_states": settings.long_states,
            "compile": settings.compile,
            "compile_cache": str(settings.model_dir / "compiled"),
        }
        if calibrations:
            options["calibrations"] = calibrations
        spec = EngineSpec(
            factory=factory,
            checkpoints={key: str(path) for key, path in checkpoints.items() if path is not None},
            preload=list(preload),
            options=options,
        )
        return cls(name, ProcessRuntime(name, spec, settings), selectors, choose)

    async def start(self) -> None:
        """Nothing to open: the worker starts when residency first loads it."""

    async def close(self) -> None:
        """Residency has normally stopped the worker already."""
        await self.runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(self._selectors)

    async def accept(self, selector: str, request: SystemOneRequest) -> Job:
        return Job(
            checkpoint=await self._choose(selector, request),
            state=request.state,
            questions=request.questions,
            config=request.config,
        )
