"""Which model names exist and which provider answers each; a local name always wins over a
hosted one of the same spelling."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from decidealot.contract import ModelInfo, SystemOneRequest
from decidealot.errors import ProviderUnavailable
from decidealot.protocols import Provider


@dataclass(frozen=True, slots=True)
class Route:
    provider: Provider
    selector: str

    @property
    def accepts_temperature(self) -> bool:
        return self.provider.accepts_temperature


class Routed(NamedTuple):
    request: SystemOneRequest
    route: Route


class Catalog:
    """Model names of the configured providers; hosted names are looked up only when needed."""

    def __init__(self, providers: Sequence[Provider]) -> None:
        self._local: dict[str, tuple[ModelInfo, Provider]] = {}
        self._hosted = [p for p in providers if not p.local]
        self._pending = [p for p in providers if p.local]

    async def start(self) -> None:
        """Collect the local providers' selectors, in provider order (first one wins)."""
        for provider in self._pending:
            for info in await provider.models():
                self._local.setdefault(info.name, (info, provider))
        self._pending = []

    async def models(self) -> list[ModelInfo]:
        """Every accepted name; ProviderUnavailable when a hosted catalog cannot be read."""
        listing = [info for info, _ in self._local.values()]
        seen = set(self._local)
        for provider in self._hosted:
            for info in await self._hosted_models(provider):
                if info.name not in seen:
                    seen.add(info.name)
                    listing.append(info)
        return listing

    async def resolve(self, names: Iterable[str]) -> dict[str, Route | None]:
        """Route for each name (None: unknown). Reads hosted catalogs only for non-local names."""
        routes: dict[str, Route | None] = {}
        for name in names:
            local = self._local.get(name)
            routes[name] = Route(local[1], name) if local is not None else None
        if self._hosted and any(route is None for route in routes.values()):
            for provider in self._hosted:
                hosted = {info.name for info in await self._hosted_models(provider)}
                for name, route in routes.items():
                    if route is None and name in hosted:
                        routes[name] = Route(provider, name)
        return routes

    @staticmethod
    async def _hosted_models(provider: Provider) -> list[ModelInfo]:
        try:
            models = await provider.models()
        except ProviderUnavailable:
            raise
        except Exception as exc:  # a malformed catalog is unavailable, never a 500
            raise ProviderUnavailable("the hosted model catalog is unavailable") from exc
        if not isinstance(models, list) or not all(isinstance(m, ModelInfo) for m in models):
            raise ProviderUnavailable("the hosted model catalog is unavailable")
        return models
