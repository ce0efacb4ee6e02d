"""A local provider answering in-process: its job straight to its runtime, no residency."""

from __future__ import annotations

from typing import Any

import msgspec

from decidealot.contract import SystemOneRequest, SystemOneResponse
from decidealot.executor import respond
from decidealot.jobs import Job
from decidealot.protocols import LocalProvider
from decidealot.service import Service
from decidealot.validation.requests import validate_request


class Deciding:
    """Wraps a `LocalProvider` with `decide(selector, request)`: what the executor does for
    one request, less the residency slot and lane; other attributes are the provider's."""

    def __init__(self, provider: LocalProvider) -> None:
        self.provider = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        if not self.provider.runtime.loaded:
            await self.provider.runtime.load()
        accepted = await self.provider.accept(selector, request)
        if isinstance(accepted, Job):
            return respond(await self.provider.runtime.submit(accepted))
        made = await accepted.make()
        return respond(await self.provider.runtime.submit(made.job), made.gateway_tokens)


async def through_service(service: Service, request: SystemOneRequest) -> SystemOneResponse:
    """What `POST /v1/systemone` does with `request` on `service`: validate (which routes it),
    then decide."""
    routed = await validate_request(msgspec.to_builtins(request), service.catalog)
    return (await service.executor.decide(routed)).body
