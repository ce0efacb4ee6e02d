"""The running service: configured providers, residency, catalog and executor, plus draining.

This is where the layers are put together: the providers are built from the settings (with
every checkpoint path filled from the installed bundles), each local runtime is registered
with residency on the lane its device asks for, and the catalog collects the selectors. HTTP
and MCP both drive one `Service`; it knows nothing about either transport.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Sequence
from typing import cast

from decidealot import logs
from decidealot.catalog import Catalog
from decidealot.checkpoints import install as bundles
from decidealot.config import Settings
from decidealot.contract import Health, ModelInfo, ModelList
from decidealot.executor import Executor
from decidealot.protocols import LocalProvider, Provider
from decidealot.residency import Residency

log = logging.getLogger("decidealot.service")

PROVIDER_CLASSES = {
    "laya": "decidealot.providers.laya.gateway.provider:LayaProvider",
    "von": "decidealot.providers.von.gateway.provider:VonProvider",
    "clm": "decidealot.providers.clm.gateway.provider:ClmProvider",
    "jev": "decidealot.providers.jev.gateway.provider:JevProvider",
}
"""Imported lazily: a deployment imports only the providers it enables."""


def _provider_class(name: str) -> type:
    module_name, class_name = PROVIDER_CLASSES[name].split(":")
    cls: type = getattr(importlib.import_module(module_name), class_name)
    return cls


def local_selectors(name: str) -> tuple[ModelInfo, ...]:
    """The contract's selectors of local provider `name`, without building it."""
    selectors: tuple[ModelInfo, ...] = _provider_class(name).selectors  # type: ignore[attr-defined]
    return selectors


def build_providers(settings: Settings) -> list[Provider]:
    """The configured providers; checkpoint settings left unset name the installed bundles."""
    resolved = bundles.with_checkpoints(settings)
    providers: list[Provider] = []
    for name in settings.providers:
        providers.append(_provider_class(name).from_settings(resolved))  # type: ignore[attr-defined]
    return providers


def lane_for(name: str, device: str, settings: Settings) -> tuple[str | None, str]:
    """The residency lane and group of a local provider (see `decidealot.residency`).

    On CUDA every provider is its own group on lane "cuda": one provider's passes at a time on
    the device. On CPU, Laya and Von share group "models" on lane "local", so with two slots
    they overlap, while CLM (encoder calls included) is group "clm" and overlaps neither, as
    the contract asks, unless DECIDEALOT_CLM_PARALLEL_WITH_LOCAL_MODELS frees it of any lane.
    """
    if name == "clm" and settings.clm_parallel_with_local_models:
        return None, name
    if device == "cuda":
        return "cuda", name
    return "local", "clm" if name == "clm" else "models"


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
                self.residency.register(runtime, *lane_for(provider.name, runtime.device, settings))
        self.catalog = Catalog(self.providers)
        self.executor = Executor(
            self.catalog,
            self.residency,
            [p.name for p in self.providers if p.local],
            settings.max_batch_concurrency,
            settings.max_pending_requests,
        )
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
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

    async def models(self) -> ModelList:
        return ModelList(await self.catalog.models())

    # -- admission (SIGTERM: stop admitting, let in-flight requests finish) --------------------

    def enter(self) -> bool:
        """Admit one request; False once the service is draining."""
        if self.draining:
            return False
        self._in_flight += 1
        self._idle.clear()
        return True

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def drain(self, timeout: float) -> None:
        """Refuse new requests and wait (up to `timeout`) for admitted ones to finish."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning(
                "%d requests still running after %.0f s of draining", self._in_flight, timeout
            )
