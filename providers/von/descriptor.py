"""Von as the service knows it: settings, bundle, selectors, lane and how it is built."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from decidealot.config import Section, Settings, boolean, directory, file, setting
from decidealot.contract import ModelInfo
from decidealot.protocols import Provider
from decidealot.providers.gateway.checkpoint_provider import CheckpointProvider, only
from decidealot.providers.von import calibration
from decidealot.registry import Bundle, Calibration, ProviderDescriptor, Tiny, json_object_problem

CHECKPOINT = "von-1.1"  # the one checkpoint key, bundle name and every answer's `model`
RELEASE = "2026-09-22"

SELECTORS = (
    ModelInfo("von", "Von System One decisions served by the local Von 1.1 model.", RELEASE),
    ModelInfo("von-latest", "Alias for the current Von release.", RELEASE),
    ModelInfo("von-1.1", "Von 1.1 System One decision model.", RELEASE),
    ModelInfo("von-1.1.0", "Alias for the Von 1.1 point release.", RELEASE),
)

FILES = (  # what the Von engine reads from a checkpoint directory (docs/models.md lists them too)
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "option_marker.pt",
    "marker_calibration.json",
)
CHECKS = {name: json_object_problem for name in FILES if name.endswith(".json")}
"""How startup reads them: every JSON file must parse (option_marker.pt is torch's own)."""


class VonSettings(Section, frozen=True, kw_only=True):
    von_enabled: Annotated[bool, setting(boolean)] = True
    von_checkpoint: Annotated[Path | None, setting(directory)] = None
    von_calibration: Annotated[Path | None, setting(file)] = None
    """A `marker_calibration.json` replacing the checkpoint's own (upstream's `VON_CALIBRATION`)."""


def _build(settings: Settings, section: VonSettings) -> Provider:
    """Every selector is an alias of the one checkpoint, loaded at worker start."""
    return CheckpointProvider.in_worker(
        "von",
        SELECTORS,
        "decidealot.providers.von.worker.engine:create",
        {CHECKPOINT: section.von_checkpoint},
        settings,
        only(CHECKPOINT),
        preload=(CHECKPOINT,),
        calibrations=DESCRIPTOR.calibration_files(section),
    )


DESCRIPTOR = ProviderDescriptor(
    name="von",
    order=20,
    settings=VonSettings,
    enabled=lambda section: section.von_enabled,
    switch_off="DECIDEALOT_VON_ENABLED=false to turn Von off",
    off="DECIDEALOT_VON_ENABLED=false",
    build=_build,
    selectors=SELECTORS,
    bundles=(Bundle(CHECKPOINT, "von_checkpoint", files=FILES, checks=CHECKS),),
    lane_group="models",
    tiny=Tiny("decidealot.providers.von.tiny:write_bundles"),
    calibrations=(
        Calibration(
            "von_calibration",
            CHECKPOINT,
            CHECKPOINT,
            calibration.check,
            calibration.warnings,
            tuple(info.name for info in SELECTORS),
        ),
    ),
    calibrator="decidealot.providers.von.calibrate:fit",
)
