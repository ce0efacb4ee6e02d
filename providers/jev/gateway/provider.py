"""`JevProvider`: TypeSafe's hosted models behind `decidealot.protocols.HostedProvider`.

Jev runs nothing locally, so it takes no residency slot and no lane. It lists TypeSafe's catalog
exactly as TypeSafe names it (the gateway's catalog lets local selectors win a collision),
cached for a minute as the contract asks, and forwards each validated request with the
selected hosted name. An expired catalog is refreshed by the first listing or hosted request
after it; concurrent callers share that one upstream call, and a failed refresh fails them all
alike (nothing stale is served: an unavailable catalog is a 503 by contract).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from decidealot.contract import Json, ModelInfo, SystemOneRequest, SystemOneResponse
from decidealot.errors import ProviderUnavailable
from decidealot.providers.jev.gateway.client import TypeSafeClient
from decidealot.providers.jev.gateway.wire import (
    MODELS_PATH,
    SYSTEM_ONE_PATH,
    decode_answer,
    decode_models,
    encode_request,
)

log = logging.getLogger(__name__)

CATALOG_TTL_SECONDS = 60.0


class JevProvider:
    """Hosted Jev: every decision is one TypeSafe call; failures are a safe 503."""

    name = "jev"
    local = False
    accepts_temperature = False

    def __init__(
        self, client: TypeSafeClient, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`clock` times the catalog, so tests step past its TTL without sleeping."""
        self._client = client
        self._clock = clock
        self._models: list[ModelInfo] = []
        self._fetched_at: float | None = None
        self._refresh: asyncio.Task[list[ModelInfo]] | None = None

    def __repr__(self) -> str:
        return f"JevProvider(client={self._client!r})"

    async def start(self) -> None:
        await self._client.start()

    async def close(self) -> None:
        refresh, self._refresh = self._refresh, None
        if refresh is not None:
            refresh.cancel()
            await asyncio.wait([refresh])
        await self._client.close()

    async def models(self) -> list[ModelInfo]:
        """The hosted models TypeSafe lists now; raises `ProviderUnavailable`."""
        fetched_at = self._fetched_at
        if fetched_at is not None and self._clock() < fetched_at + CATALOG_TTL_SECONDS:
            return list(self._models)
        if self._refresh is None:
            self._refresh = asyncio.create_task(self._load())
            # A refresh whose every waiter was cancelled must not warn about its exception.
            self._refresh.add_done_callback(lambda t: t.cancelled() or t.exception())
        # Shielded: one waiter's cancellation must not cancel the refresh the others await.
        return list(await asyncio.shield(self._refresh))

    async def _load(self) -> list[ModelInfo]:
        try:
            models = await self._client.get(MODELS_PATH, decode_models)
        finally:
            if self._refresh is asyncio.current_task():  # close() may have let go of it
                self._refresh = None
        self._models, self._fetched_at = models, self._clock()
        return models

    def status_details(self) -> dict[str, Json]:
        """The hosted catalog's age (`GET /v1/status`); None before the first fetch."""
        age = None if self._fetched_at is None else self._clock() - self._fetched_at
        return {"catalog_age_seconds": age}

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        # A hosted request refreshes an expired catalog too; a name TypeSafe no longer lists
        # would only be refused upstream, so it is unavailable here without the call.
        if selector not in {model.name for model in await self.models()}:
            log.warning("TypeSafe no longer lists the hosted model %r", selector)
            raise ProviderUnavailable()
        body = encode_request(selector, request)
        return await self._client.post(
            SYSTEM_ONE_PATH, body, lambda content: decode_answer(content, request.questions)
        )
