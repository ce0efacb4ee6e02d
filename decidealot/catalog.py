"""Which model names exist and which provider answers each.

Local selectors and aliases are fixed by the contract and listed here, once; hosted Jev names
come from TypeSafe's catalog through the Jev provider (which caches it). A local name always
wins over a hosted one of the same spelling.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from decidealot.contract import ModelInfo
from decidealot.errors import ProviderUnavailable
from providers.base import Provider

_LAYA_DATE = "2026-09-23"
_VON_DATE = "2026-09-22"
_CLM_DATE = "2026-09-19"  # contrastive-lm 0.1.0 dates its models so (clm.engine.RELEASE)

LOCAL_MODELS: dict[str, tuple[ModelInfo, ...]] = {
    "laya": (
        ModelInfo(
            "laya", "Laya System One decisions with automatic checkpoint routing.", _LAYA_DATE
        ),
        ModelInfo("laya-auto", "Alias for laya with automatic checkpoint routing.", _LAYA_DATE),
        ModelInfo("laya-latest", "Alias for the current Laya release.", _LAYA_DATE),
        ModelInfo(
            "laya-english", "Laya English checkpoint for English Latin-script content.", _LAYA_DATE
        ),
        ModelInfo(
            "laya-multilingual",
            "Laya multilingual checkpoint for other languages and scripts.",
            _LAYA_DATE,
        ),
        ModelInfo(
            "laya-typed-decisions",
            "Laya checkpoint tuned for structured workflow decisions.",
            _LAYA_DATE,
        ),
    ),
    "von": (
        ModelInfo("von", "Von System One decisions served by the local Von 1.1 model.", _VON_DATE),
        ModelInfo("von-latest", "Alias for the current Von release.", _VON_DATE),
        ModelInfo("von-1.1", "Von 1.1 System One decision model.", _VON_DATE),
        ModelInfo("von-1.1.0", "Alias for the Von 1.1 point release.", _VON_DATE),
    ),
    "clm": (
        ModelInfo(
            "clm",
            "CLM System One decisions from the local Contrastive-LM/CLM-v0.1-8B head.",
            _CLM_DATE,
        ),
        ModelInfo("clm-latest", "Alias for the current CLM release.", _CLM_DATE),
        ModelInfo("clm-0.1", "Alias for the CLM v0.1 release.", _CLM_DATE),
        ModelInfo(
            "clm-0.1-8b",
            "Contrastive-LM/CLM-v0.1-8B projection head over Qwen3-8B vectors.",
            _CLM_DATE,
        ),
    ),
}
"""The contract's local catalog, per provider, in listing order."""

TEMPERATURE_PROVIDERS = frozenset({"clm"})
"""Providers whose selectors accept `config: {"temperature": t}`; all others take `{}` only."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where one model name goes."""

    provider: Provider
    selector: str

    @property
    def accepts_temperature(self) -> bool:
        return self.provider.name in TEMPERATURE_PROVIDERS


class Catalog:
    """Model names of the configured providers; hosted names are looked up only when needed."""

    def __init__(self, providers: Sequence[Provider]) -> None:
        self._local: dict[str, tuple[ModelInfo, Provider]] = {}
        self._hosted = [p for p in providers if not p.local]
        self._pending = [p for p in providers if p.local and p.name not in LOCAL_MODELS]
        for provider in providers:
            if provider.local:
                for info in LOCAL_MODELS.get(provider.name, ()):
                    self._local.setdefault(info.name, (info, provider))

    async def start(self) -> None:
        """Ask local providers that the contract does not list (tests' fakes) for their names."""
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
