"""TypeSafe's model list, cached for a minute as the contract asks.

The cache is refreshed by the first listing or hosted request after it expires; concurrent
callers share that one upstream call, and a failed refresh fails them all alike (nothing stale
is served: an unavailable catalog is a 503 by contract). The clock is injectable so tests can
step past the TTL without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from decidealot.contract import ModelInfo

CATALOG_TTL_SECONDS = 60.0


class HostedCatalog:
    """The hosted models TypeSafe lists now; raises whatever `fetch` raises."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[list[ModelInfo]]],
        *,
        ttl_seconds: float = CATALOG_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._ttl_seconds = ttl_seconds
        self._clock = clock
        self._models: list[ModelInfo] = []
        self._expires_at = -float("inf")
        self._refresh: asyncio.Task[list[ModelInfo]] | None = None
        self._fetched_at: float | None = None

    def __repr__(self) -> str:
        return f"HostedCatalog(models={len(self._models)}, ttl_seconds={self._ttl_seconds})"

    async def models(self) -> list[ModelInfo]:
        if self._clock() < self._expires_at:
            return list(self._models)
        if self._refresh is None:
            self._refresh = asyncio.create_task(self._load())
            # A refresh whose every waiter was cancelled must not warn about its exception.
            self._refresh.add_done_callback(lambda t: t.cancelled() or t.exception())
        # Shielded: one waiter's cancellation must not cancel the refresh the others await.
        return list(await asyncio.shield(self._refresh))

    async def close(self) -> None:
        refresh, self._refresh = self._refresh, None
        if refresh is not None:
            refresh.cancel()
            await asyncio.wait([refresh])

    async def _load(self) -> list[ModelInfo]:
        try:
            models = await self._fetch()
        finally:
            if self._refresh is asyncio.current_task():  # close() may have let go of it
                self._refresh = None
        self._models = models
        self._fetched_at = self._clock()
        self._expires_at = self._fetched_at + self._ttl_seconds
        return models

    def age_seconds(self) -> float | None:
        """Seconds since the catalog last came from TypeSafe; None before the first fetch."""
        return None if self._fetched_at is None else self._clock() - self._fetched_at
