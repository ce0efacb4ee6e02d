"""`JevProvider`: TypeSafe's hosted models behind `decidealot.protocols.HostedProvider`.

Jev runs nothing locally, so it takes no residency slot and no lane (a `HostedProvider`).
It lists TypeSafe's catalog exactly as TypeSafe names it (the gateway's catalog lets local
selectors win a collision) and forwards each validated request with the selected hosted name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from decidealot.contract import Json, ModelInfo, SystemOneRequest, SystemOneResponse
from decidealot.errors import ProviderUnavailable
from decidealot.providers.jev.gateway.catalog import HostedCatalog
from decidealot.providers.jev.gateway.client import TypeSafeClient
from decidealot.providers.jev.gateway.wire import (
    MODELS_PATH,
    SYSTEM_ONE_PATH,
    decode_answer,
    decode_models,
    encode_request,
)

log = logging.getLogger(__name__)


class JevProvider:
    """Hosted Jev: every decision is one TypeSafe call; failures are a safe 503."""

    name = "jev"
    local = False
    accepts_temperature = False

    def __init__(
        self, client: TypeSafeClient, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._catalog = HostedCatalog(self._fetch_models, clock=clock)

    def __repr__(self) -> str:
        return f"JevProvider(client={self._client!r})"

    __str__ = __repr__

    async def start(self) -> None:
        await self._client.start()

    async def close(self) -> None:
        await self._catalog.close()
        await self._client.close()

    async def models(self) -> list[ModelInfo]:
        return await self._catalog.models()

    def status_details(self) -> dict[str, Json]:
        """The hosted catalog's age (`GET /v1/status`)."""
        return {"catalog_age_seconds": self._catalog.age_seconds()}

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        # A hosted request refreshes an expired catalog too; a name TypeSafe no longer lists
        # would only be refused upstream, so it is unavailable here without the call.
        if selector not in {model.name for model in await self._catalog.models()}:
            log.warning("TypeSafe no longer lists the hosted model %r", selector)
            raise ProviderUnavailable()
        body = encode_request(selector, request)
        return await self._client.post(
            SYSTEM_ONE_PATH, body, lambda content: decode_answer(content, request.questions)
        )

    async def _fetch_models(self) -> list[ModelInfo]:
        return await self._client.get(MODELS_PATH, decode_models)
