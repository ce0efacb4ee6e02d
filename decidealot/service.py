"""The running service, where the layers are put together: the enabled providers built by
their descriptors (every checkpoint path filled), each local runtime registered with residency on
its descriptor's lane, the catalog of their selectors. HTTP and MCP both drive one `Service`; it
knows nothing about either transport.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import cast

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
from decidealot.executor import Executor
from decidealot.jobs import CheckpointLoad
from decidealot.ledger import Ledger
from decidealot.protocols import LocalProvider, LocalRuntime, Provider, ReportsDetails
from decidealot.residency import Residency

log = logging.getLogger("decidealot.service")


def build_providers(settings: Settings) -> list[Provider]:
    """Checkpoint settings left unset name the installed bundles."""
    resolved = with_checkpoints(settings)
    return [d.build(resolved, d.of(resolved)) for d in registry.enabled(resolved)]


def lane_of(name: str, runtime: LocalRuntime, settings: Settings) -> tuple[str | None, str]:
    """Its descriptor's rule; a provider not registered takes turns with every other."""
    try:
        descriptor = registry.descriptor(name)
    except KeyError:
        return ("cuda" if runtime.device == "cuda" else "local"), name
    return descriptor.lane_for(descriptor.of(settings), runtime.device)


def _calibrations(name: str, settings: Settings) -> dict[str, str]:
    """Checkpoint key -> the calibration file a `*_CALIBRATION` setting gives it."""
    try:
        descriptor = registry.descriptor(name)
    except KeyError:
        return {}
    return descriptor.calibration_files(descriptor.of(settings))


def _provider_status(provider: Provider, ledger: Ledger, settings: Settings) -> ProviderStatus:
    details = provider.status_details() if isinstance(provider, ReportsDetails) else {}
    if not provider.local:
        return ProviderStatus(name=provider.name, enabled=True, local=False, details=details)
    runtime = cast(LocalProvider, provider).runtime
    calibrations = _calibrations(provider.name, settings)
    return ProviderStatus(
        name=provider.name,
        enabled=True,
        local=True,
        loaded=runtime.loaded,
        device=runtime.device,
        running=ledger.holding(runtime.name),
        checkpoints=[
            _checkpoint_status(load, calibrations.get(load.checkpoint))
            for load in runtime.checkpoints()
        ],
        details=details,
    )


def _checkpoint_status(load: CheckpointLoad, calibration: str | None) -> CheckpointStatus:
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
        passes=load.passes,
        compile_state=load.compile_state,
        compile_reason=load.compile_reason,
        compile_seconds=load.compile_seconds,
        compiled_graphs=load.compiled_graphs,
        cached_graphs=load.cached_graphs,
    )


class Service:
    def __init__(
        self,
        settings: Settings,
        providers: Sequence[Provider] | None = None,
        residency: Residency | None = None,
    ) -> None:
        """`providers` None: build the configured ones. Every local provider's runtime is
        registered with `residency` (a new one when None) on its lane; the residency's ledger
        is the service's."""
        self.settings = settings
        self.residency = Residency(settings) if residency is None else residency
        self.ledger = self.residency.ledger
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
        )

    async def start(self) -> None:
        for provider in self.providers:
            await provider.start()
        await self.catalog.start()
        await self.residency.start()

    async def close(self) -> None:
        """After the last request has finished."""
        self.ledger.draining = True
        await self.residency.close()
        for provider in self.providers:
            try:
                await provider.close()
            except Exception as exc:
                logs.log_failure(log, exc, f"closing provider {provider.name}")

    def health(self) -> Health:
        return Health("ok", [p.name for p in self.providers])

    def status(self) -> Status:
        """`GET /v1/status`."""
        built = {provider.name: provider for provider in self.providers}
        ledger = self.ledger
        providers = [
            _provider_status(built[d.name], ledger, self.settings)
            if d.name in built
            else ProviderStatus(name=d.name, enabled=False, local=d.local)
            for d in registry.registered()
        ]
        flags = cpu.flags()
        return Status(
            status="draining" if ledger.draining else "ok",
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
                queued=ledger.waiting(), running=ledger.holding(), limit=ledger.max_pending
            ),
        )

    async def models(self) -> ModelList:
        return ModelList(await self.catalog.models())
