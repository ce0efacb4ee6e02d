"""The running service: configured providers, residency, catalog and executor, plus draining.

This is where the layers are put together: the registered providers the settings enable are
built by their descriptors (with every checkpoint path filled from the installed bundles), each
local runtime is registered with residency on the lane its descriptor gives it, and the catalog
collects the selectors. HTTP
and MCP both drive one `Service`; it knows nothing about either transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from decidealot import cpu, logs, registry
from decidealot.catalog import Catalog
from decidealot.checkpoints.manifest import read_record
from decidealot.checkpoints.paths import with_checkpoints
from decidealot.config import Settings
from decidealot.contract import (
    CheckpointStatus,
    CpuStatus,
    DecisionStatus,
    Health,
    ModelList,
    ProviderStatus,
    SlotStatus,
    Status,
)
from decidealot.errors import ShuttingDown
from decidealot.executor import Executor
from decidealot.frames import Loaded
from decidealot.protocols import (
    LocalProvider,
    LocalRuntime,
    Provider,
    ReportsCheckpoints,
    ReportsDetails,
)
from decidealot.residency import Residency

log = logging.getLogger("decidealot.service")

_UNWIND_SECONDS = 5.0
"""How long requests cancelled at the end of a drain get to unwind and answer."""

CUT_SHORT = ShuttingDown("the service shut down before this request finished")
"""What a request the drain cancelled is answered (503)."""

ADMITTED = contextvars.ContextVar[asyncio.Task[Any] | None]("decidealot_admitted", default=None)
"""The task of the admitted request being served here, where a transport hands its work to
another task (the MCP SDK runs each `/mcp` tool call on a task of its own): see `cut_instead`."""


def build_providers(settings: Settings) -> list[Provider]:
    """The enabled providers, each built by its descriptor; checkpoint settings left unset
    name the installed bundles."""
    resolved = with_checkpoints(settings)
    return [d.build(resolved, d.of(resolved)) for d in registry.enabled(resolved)]


def lane_of(name: str, runtime: LocalRuntime, settings: Settings) -> tuple[str | None, str]:
    """The residency lane and group of local provider `name`: its descriptor's rule
    (`ProviderDescriptor.lane_for`); one not registered takes turns with every other."""
    try:
        descriptor = registry.descriptor(name)
    except KeyError:
        return ("cuda" if runtime.device == "cuda" else "local"), name
    return descriptor.lane_for(descriptor.of(settings), runtime.device)


def _disabled(name: str, local: bool) -> ProviderStatus:
    return ProviderStatus(name=name, enabled=False, local=local)


def _calibrations(name: str, settings: Settings) -> dict[str, str]:
    """Checkpoint key -> the calibration file a `*_CALIBRATION` setting gives it (unset: the
    temperatures the checkpoint ships)."""
    try:
        descriptor = registry.descriptor(name)
    except KeyError:
        return {}
    section = descriptor.of(settings)
    files = {c.key: getattr(section, c.setting, None) for c in descriptor.calibrations}
    return {key: str(path) for key, path in files.items() if path is not None}


def _provider_status(
    provider: Provider, residency: Residency, settings: Settings
) -> ProviderStatus:
    details = provider.status_details() if isinstance(provider, ReportsDetails) else {}
    if not provider.local:
        return ProviderStatus(name=provider.name, enabled=True, local=False, details=details)
    runtime = cast(LocalProvider, provider).runtime
    loads = runtime.checkpoints() if isinstance(runtime, ReportsCheckpoints) else []
    calibrations = _calibrations(provider.name, settings)
    return ProviderStatus(
        name=provider.name,
        enabled=True,
        local=True,
        loaded=runtime.loaded,
        device=runtime.device,
        running=residency.active(runtime.name),
        checkpoints=[_checkpoint_status(load, calibrations.get(load.checkpoint)) for load in loads],
        details=details,
    )


def _checkpoint_status(load: Loaded, calibration: str | None) -> CheckpointStatus:
    folder = Path(load.path)
    record = read_record(folder) or read_record(folder.parent)  # a bundle's entry file
    return CheckpointStatus(
        name=load.checkpoint,
        precision=load.precision,
        requested=load.requested,
        reason=load.reason,
        folder=load.path,
        verified=None if record is None else f"{record.repo}@{record.revision}",
        int8_share=load.int8_share,
        calibration=calibration,
    )


class Service:
    def __init__(
        self,
        settings: Settings,
        providers: Sequence[Provider] | None = None,
        residency: Residency | None = None,
    ) -> None:
        """`providers` None: build the configured ones. Every local provider's runtime is
        registered with `residency` (a new one when None) on its lane."""
        self.settings = settings
        self.residency = Residency(settings) if residency is None else residency
        self.providers: list[Provider] = (
            build_providers(settings) if providers is None else list(providers)
        )
        for provider in self.providers:
            if provider.local:
                runtime = cast(LocalProvider, provider).runtime
                self.residency.register(runtime, *lane_of(provider.name, runtime, settings))
        self.catalog = Catalog(self.providers)
        self.executor = Executor(
            self.residency,
            [p.name for p in self.providers if p.local],
            settings.max_batch_concurrency,
            settings.max_pending_requests,
        )
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._requests: set[asyncio.Task[Any]] = set()
        self._cut: set[asyncio.Task[Any]] = set()
        self.draining = False

    async def start(self) -> None:
        for provider in self.providers:
            await provider.start()
        await self.catalog.start()
        await self.residency.start()

    async def close(self) -> None:
        """Stop workers and clients; called after the last request has finished."""
        self.draining = True
        await self.residency.close()
        for provider in self.providers:
            try:
                await provider.close()
            except Exception as exc:
                logs.log_failure(log, exc, f"closing provider {provider.name}")

    def health(self) -> Health:
        return Health("ok", [p.name for p in self.providers])

    def status(self) -> Status:
        """What runs (`GET /v1/status`): each registered provider, the checkpoints each local
        worker holds and in what precision and why, residency slots, and decisions in flight."""
        built = {provider.name: provider for provider in self.providers}
        providers = [
            _provider_status(built[d.name], self.residency, self.settings)
            if d.name in built
            else _disabled(d.name, d.local)
            for d in registry.registered()
        ]
        running = sum(p.running for p in providers)
        flags = cpu.flags()
        return Status(
            status="draining" if self.draining else "ok",
            precision=self.settings.precision,
            cpu=CpuStatus(
                bf16_units=list(cpu.bf16_units(flags)), int8_units=list(cpu.int8_units(flags))
            ),
            providers=providers,
            slots=SlotStatus(
                total=self.settings.max_resident_providers,
                held_by=[n for n in self.residency.names if self.residency.loaded(n)],
            ),
            decisions=DecisionStatus(
                queued=max(0, self.executor.pending - running),
                running=running,
                limit=self.settings.max_pending_requests,
            ),
        )

    async def models(self) -> ModelList:
        return ModelList(await self.catalog.models())

    # -- admission (SIGTERM: stop admitting, let admitted requests finish) --------------------

    def enter(self, task: asyncio.Task[Any] | None = None) -> bool:
        """Admit one request; False once the service is draining. `task` is the request's
        own: a drain that runs out cancels it (see `drain`)."""
        if self.draining:
            return False
        self._in_flight += 1
        self._idle.clear()
        if task is not None:
            self._requests.add(task)
        return True

    def leave(self, task: asyncio.Task[Any] | None = None) -> None:
        if task is not None:
            self._requests.discard(task)
            self._cut.discard(task)
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished: what a drain waits for."""
        return self._in_flight

    @contextlib.contextmanager
    def cut_instead(
        self, request: asyncio.Task[Any] | None, worker: asyncio.Task[Any] | None
    ) -> Iterator[None]:
        """While the block runs, a drain that runs out cancels `worker`, the task doing the
        work of admitted request `request`, instead of `request` itself: the work then answers
        `CUT_SHORT` in its own terms (an MCP tool error) and the request's response completes,
        where cancelling the request would cut its response off. Nothing changes for a request
        not admitted with its task, or already cut."""
        if request is None or worker is None or request not in self._requests - self._cut:
            yield
            return
        self._requests.discard(request)
        self._requests.add(worker)
        try:
            yield
        finally:
            self._requests.discard(worker)
            self._cut.discard(worker)
            self._requests.add(request)

    def was_cut(self, task: asyncio.Task[Any]) -> bool:
        """Whether the drain cancelled `task` (then its request is answered `ShuttingDown`)."""
        return task in self._cut

    async def drain(self, seconds: float) -> None:
        """Refuse new requests (503 `ShuttingDown`) and let the admitted ones run for up to
        `seconds` (DECIDEALOT_DRAIN_SECONDS); then cancel the ones still running, whose
        requests the gateway answers 503, and wait briefly for them to unwind."""
        self.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), seconds)
            return
        log.warning(
            "%d requests still running after %g s of draining (DECIDEALOT_DRAIN_SECONDS): "
            "answering them 503",
            self._in_flight,
            seconds,
        )
        self._cut = set(self._requests)
        for task in self._cut:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), _UNWIND_SECONDS)
            return
        log.warning("%d requests did not unwind after the drain", self._in_flight)
