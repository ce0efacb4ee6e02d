"""`VonProvider`: the gateway side of Von, behind `providers.base.Provider`.

Every Von selector runs the one Von 1.1 checkpoint in a worker process; this module imports no
torch, directly or indirectly.
"""

from __future__ import annotations

from decidealot.config import Settings
from decidealot.contract import SystemOneRequest
from providers.resident import ResidentProvider

CHECKPOINT = "von-1.1"
"""The one checkpoint key; also the bundle name and the `model` every answer reports."""

ENGINE_FACTORY = "providers.von.engine:create"


class VonProvider(ResidentProvider):
    """Local Von: every selector is an alias of the one checkpoint, loaded at worker start."""

    name = "von"
    engine_factory = ENGINE_FACTORY

    @classmethod
    def checkpoints(cls, settings: Settings) -> dict[str, str]:
        from decidealot.bundles import checkpoint_path

        return {CHECKPOINT: str(checkpoint_path(settings, CHECKPOINT))}

    @classmethod
    def preload(cls) -> list[str]:
        return [CHECKPOINT]

    def checkpoint_for(self, selector: str, request: SystemOneRequest) -> str:
        return CHECKPOINT
