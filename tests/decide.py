"""A local provider answering in-process: its job straight to its runtime, no residency."""

from __future__ import annotations

from typing import Any

from decidealot.contract import SystemOneRequest, SystemOneResponse
from decidealot.executor import respond
from decidealot.protocols import LocalProvider


class Deciding:
    """Wraps a `LocalProvider` with `decide(selector, request)`: what the executor does for
    one request, less the residency slot and lane; other attributes are the provider's."""

    def __init__(self, provider: LocalProvider) -> None:
        self.provider = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        prepared = await self.provider.prepare(selector, request)
        if prepared.rest is not None:
            prepared = await prepared.rest()
        assert prepared.job is not None
        return respond(prepared, await self.provider.runtime.submit(prepared.job))
