"""`VonProvider`: the gateway side of Von, behind `decidealot.protocols.LocalProvider`.

Every Von selector runs the one Von 1.1 checkpoint in a worker process; this module imports no
torch, directly or indirectly.
"""

from __future__ import annotations

from decidealot.providers.gateway.checkpoint_provider import ResidentProvider

from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest

CHECKPOINT = "von-1.1"
"""The one checkpoint key; also the bundle name and the `model` every answer reports."""

ENGINE_FACTORY = "decidealot.providers.von.worker.engine:create"
RELEASE = "2026-09-22"

SELECTORS = (
    ModelInfo("von", "Von System One decisions served by the local Von 1.1 model.", RELEASE),
    ModelInfo("von-latest", "Alias for the current Von release.", RELEASE),
    ModelInfo("von-1.1", "Von 1.1 System One decision model.", RELEASE),
    ModelInfo("von-1.1.0", "Alias for the Von 1.1 point release.", RELEASE),
)


class VonProvider(ResidentProvider):
    """Local Von: every selector is an alias of the one checkpoint, loaded at worker start."""

    name = "von"
    engine_factory = ENGINE_FACTORY
    selectors = SELECTORS

    @classmethod
    def checkpoints(cls, settings: Settings) -> dict[str, str]:
        path = settings.von_checkpoint
        return {} if path is None else {CHECKPOINT: str(path)}

    @classmethod
    def preload(cls) -> list[str]:
        return [CHECKPOINT]

    async def checkpoint_for(self, selector: str, request: SystemOneRequest) -> str:
        return CHECKPOINT
