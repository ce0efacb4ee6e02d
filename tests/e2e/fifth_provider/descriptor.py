"""The fifth provider as the service knows it: a weighted coin on a one-file checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from decidealot.config import Section, Settings, boolean, directory, setting
from decidealot.contract import ModelInfo
from decidealot.protocols import Provider
from decidealot.providers.gateway.checkpoint_provider import CheckpointProvider, only
from decidealot.registry import Bundle, ProviderDescriptor

HERE = Path(__file__).resolve().parent
CHECKPOINT = "fifth-1"

SELECTORS = (
    ModelInfo("fifth", "A weighted coin: the fifth provider of the registry test.", "2026-12-01"),
    ModelInfo("fifth-latest", "Alias for the current fifth release.", "2026-12-01"),
)


class FifthSettings(Section, frozen=True, kw_only=True):
    fifth_enabled: Annotated[bool, setting(boolean)] = True
    fifth_checkpoint: Annotated[Path | None, setting(directory)] = None


def _build(settings: Settings, section: FifthSettings) -> Provider:
    return CheckpointProvider.in_worker(
        "fifth",
        SELECTORS,
        "tests.e2e.fifth_provider.engine:create",
        {CHECKPOINT: section.fifth_checkpoint},
        settings,
        only(CHECKPOINT),
        preload=(CHECKPOINT,),
    )


DESCRIPTOR = ProviderDescriptor(
    name="fifth",
    order=50,
    settings=FifthSettings,
    enabled=lambda section: section.fifth_enabled,
    switch_off="DECIDEALOT_FIFTH_ENABLED=false to turn the fifth provider off",
    off="DECIDEALOT_FIFTH_ENABLED=false",
    build=_build,
    selectors=SELECTORS,
    bundles=(Bundle(CHECKPOINT, "fifth_checkpoint", files=("weights.json",), manifests=HERE),),
    lane_group="models",
)
