"""`LayaProvider`: the gateway side of Laya, behind `decidealot.protocols.LocalProvider`.

Routes each request to one of three checkpoints (`router`, pure Python, on a
worker thread: it may read a large state whole), then runs it as one job on the Laya worker,
which hosts all three. Imports no torch, directly or indirectly.
"""

from __future__ import annotations

import asyncio

from decidealot.providers.gateway.checkpoint_provider import ResidentProvider
from decidealot.providers.laya.gateway.router import route

from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest

ENGINE_FACTORY = "decidealot.providers.laya.worker.engine:create"
RELEASE = "2026-09-23"

SELECTORS = (
    ModelInfo("laya", "Laya System One decisions with automatic checkpoint routing.", RELEASE),
    ModelInfo("laya-auto", "Alias for laya with automatic checkpoint routing.", RELEASE),
    ModelInfo("laya-latest", "Alias for the current Laya release.", RELEASE),
    ModelInfo("laya-english", "Laya English checkpoint for English Latin-script content.", RELEASE),
    ModelInfo(
        "laya-multilingual",
        "Laya multilingual checkpoint for other languages and scripts.",
        RELEASE,
    ),
    ModelInfo(
        "laya-typed-decisions",
        "Laya checkpoint tuned for structured workflow decisions.",
        RELEASE,
    ),
)


class LayaProvider(ResidentProvider):
    """Local Laya. Nothing is preloaded: the worker loads a checkpoint on its first job, so a
    deployment that only ever routes to one never holds the other two in memory."""

    name = "laya"
    engine_factory = ENGINE_FACTORY
    selectors = SELECTORS

    @classmethod
    def checkpoints(cls, settings: Settings) -> dict[str, str]:
        paths = {
            "english": settings.laya_english_checkpoint,
            "multilingual": settings.laya_multilingual_checkpoint,
            "typed-decisions": settings.laya_typed_decisions_checkpoint,
        }
        return {key: str(path) for key, path in paths.items() if path is not None}

    async def checkpoint_for(self, selector: str, request: SystemOneRequest) -> str:
        """Routing reads every line of every string value (as upstream), so it runs off the
        event loop."""
        return await asyncio.to_thread(route, selector, request.state, request.questions)
