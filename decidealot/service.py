"""The running service: configured providers, residency, catalog and executor, plus draining.

HTTP and MCP both drive one `Service`; it knows nothing about either transport.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Sequence

from decidealot import logs, tracing
from decidealot.catalog import Catalog
from decidealot.config import Settings
from decidealot.contract import Health, ModelList
from decidealot.executor import Executor
from decidealot.residency import Residency
from providers.base import Provider

log = logging.getLogger("decidealot.service")

PROVIDER_CLASSES = {
    "laya": "providers.laya.provider:LayaProvider",
    "von": "providers.von.provider:VonProvider",
    "clm": "providers.clm.provider:ClmProvider",
    "jev": "providers.jev.provider:JevProvider",
}
"""Imported lazily: a deployment imports only the providers it enables."""


def build_providers(settings: Settings, residency: Residency) -> list[Provider]:
    providers: list[Provider] = []
    for name in settings.providers:
        module_name, class_name = PROVIDER_CLASSES[name].split(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        providers.append(cls.from_settings(settings, residency))
    return providers


class Service:
    def __init__(
        self,
        settings: Settings,
        providers: Sequence[Provider] | None = None,
        residency: Residency | None = None,
    ) -> None:
        """`providers` None: build the configured ones; given ones registered with `residency`."""
        self.settings = settings
        self.residency = Residency(settings) if residency is None else residency
        self.providers: list[Provider] = (
            build_providers(settings, self.residency) if providers is None else list(providers)
        )
        self.catalog = Catalog(self.providers)
        self.executor = Executor(
            self.catalog,
            self.residency,
            [p.name for p in self.providers if p.local],
            settings.max_batch_concurrency,
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
        with tracing.span("admission") as span:
            if self.draining:
                span.fail("draining")
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
