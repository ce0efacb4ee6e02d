"""Laya as the service knows it: settings, bundles, selectors, lane and how it is built."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from decidealot.config import Section, Settings, boolean, directory, file, setting
from decidealot.contract import ModelInfo
from decidealot.protocols import Provider
from decidealot.providers.gateway.checkpoint_provider import CheckpointProvider
from decidealot.providers.laya import CHECKPOINTS, calibration
from decidealot.providers.laya.gateway.router import DIRECT_SELECTORS, checkpoint_for
from decidealot.registry import (
    Bundle,
    Calibration,
    ProviderDescriptor,
    Tiny,
    json_object_problem,
    safetensors_header,
)

RELEASE = "2026-09-23"

SELECTORS = tuple(
    ModelInfo(name, description, RELEASE)
    for name, description in (
        ("laya", "Laya System One decisions with automatic checkpoint routing."),
        ("laya-auto", "Alias for laya with automatic checkpoint routing."),
        ("laya-latest", "Alias for the current Laya release."),
        ("laya-english", "Laya English checkpoint for English Latin-script content."),
        ("laya-multilingual", "Laya multilingual checkpoint for other languages and scripts."),
        ("laya-typed-decisions", "Laya checkpoint tuned for structured workflow decisions."),
    )
)

FILES = (  # what the Laya engine reads from a checkpoint directory (docs/models.md lists them)
    "rl_agent_config.json",
    "model.safetensors",
    "encoder/config.json",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
)
CHECKS = {
    name: safetensors_header if name.endswith(".safetensors") else json_object_problem
    for name in FILES
}
"""How startup reads each of them (a file that would not parse stops `serve`)."""


class LayaSettings(Section, frozen=True, kw_only=True):
    laya_enabled: Annotated[bool, setting(boolean)] = True
    laya_english_checkpoint: Annotated[Path | None, setting(directory)] = None
    laya_multilingual_checkpoint: Annotated[Path | None, setting(directory)] = None
    laya_typed_decisions_checkpoint: Annotated[Path | None, setting(directory)] = None
    laya_english_calibration: Annotated[Path | None, setting(file)] = None
    laya_multilingual_calibration: Annotated[Path | None, setting(file)] = None
    laya_typed_decisions_calibration: Annotated[Path | None, setting(file)] = None
    """laya's `Agent.save_calibration` payload: it replaces the checkpoint's temperatures."""


def _setting(key: str, what: str = "checkpoint") -> str:
    return f"laya_{key.replace('-', '_')}_{what}"


def _build(settings: Settings, section: LayaSettings) -> Provider:
    """Nothing is preloaded: a deployment that only routes to one never holds the other two."""
    return CheckpointProvider.in_worker(
        "laya",
        SELECTORS,
        "decidealot.providers.laya.worker.engine:create",
        {key: getattr(section, _setting(key)) for key in CHECKPOINTS},
        settings,
        checkpoint_for,
        calibrations=DESCRIPTOR.calibration_files(section),
    )


DESCRIPTOR = ProviderDescriptor(
    name="laya",
    order=10,
    settings=LayaSettings,
    enabled=lambda section: section.laya_enabled,
    switch_off="DECIDEALOT_LAYA_ENABLED=false to turn Laya off",
    off="DECIDEALOT_LAYA_ENABLED=false",
    build=_build,
    selectors=SELECTORS,
    bundles=tuple(
        Bundle(f"laya-{key}", _setting(key), files=FILES, checks=CHECKS) for key in CHECKPOINTS
    ),
    lane_group="models",
    tiny=Tiny("decidealot.providers.laya.tiny:write_bundles"),
    calibrations=tuple(
        Calibration(
            _setting(key, "calibration"),
            f"laya-{key}",
            key,
            calibration.check,
            calibration.warnings,
            tuple(s for s, k in DIRECT_SELECTORS.items() if k == key),
        )
        for key in CHECKPOINTS
    ),
    calibrator="decidealot.providers.laya.calibrate:fit",
)
