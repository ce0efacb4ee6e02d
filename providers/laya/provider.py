"""`LayaProvider`: the gateway side of Laya, behind `providers.base.Provider`.

Routes each request to one of three checkpoints (`providers.laya.router`, pure Python), then
runs it as one job on the Laya worker, which hosts all three. Imports no torch, directly or
indirectly.
"""

from __future__ import annotations

from decidealot.config import Settings
from decidealot.contract import SystemOneRequest
from providers.laya.router import route
from providers.resident import ResidentProvider

ENGINE_FACTORY = "providers.laya.engine:create"
BUNDLES = {
    "english": "laya-english",
    "multilingual": "laya-multilingual",
    "typed-decisions": "laya-typed-decisions",
}
"""Checkpoint key -> bundle name (the directory under the model dir, or its override)."""


class LayaProvider(ResidentProvider):
    """Local Laya. Nothing is preloaded: the worker loads a checkpoint on its first job, so a
    deployment that only ever routes to one never holds the other two in memory."""

    name = "laya"
    engine_factory = ENGINE_FACTORY

    @classmethod
    def checkpoints(cls, settings: Settings) -> dict[str, str]:
        from decidealot.bundles import checkpoint_path

        return {key: str(checkpoint_path(settings, bundle)) for key, bundle in BUNDLES.items()}

    def checkpoint_for(self, selector: str, request: SystemOneRequest) -> str:
        return route(selector, request.state, request.questions)
