"""Checks `serve` and `prepare` run before anything listens: device, bundles, checkpoint files.

A checkpoint directory that lacks a file its engine reads would otherwise start, and fail every
request to it with a worker traceback; `DECIDEALOT_DEVICE=cuda` on a machine where torch sees no
GPU would start a worker that fails every pass. Both are told here, in one message naming the
setting (or bundle) and the file. Nothing here imports torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

from decidealot.checkpoints import install as bundles
from decidealot.config import ConfigError, Settings

log = logging.getLogger("decidealot.preflight")

REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    "laya": (
        "rl_agent_config.json",
        "model.safetensors",
        "encoder/config.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ),
    "von": (
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "option_marker.pt",
        "marker_calibration.json",
    ),
    "clm": (),  # the head is one file: the checkpoint path itself
}
"""Files each engine reads from a checkpoint directory (docs/models.md lists them too)."""


class CheckpointError(Exception):
    """Checkpoints that cannot be served; the message names each setting or bundle and file."""


def _problems(path: Path, kind: str) -> list[str]:
    if kind == "clm":
        if not path.is_file():
            return ["the head file is missing"]
        if path.stat().st_size == 0:
            return ["the head file is empty"]
        return []
    if not path.is_dir():
        return ["the directory is missing"]
    engine = kind.capitalize()
    missing = [name for name in REQUIRED_FILES[kind] if not (path / name).is_file()]
    return [f"{name} is missing (the {engine} engine reads it)" for name in missing]


def checkpoint_problems(settings: Settings, *, overrides_only: bool = False) -> list[str]:
    """One line per enabled checkpoint that lacks a file its engine reads.

    With `overrides_only`, only the local checkpoints the settings name (checked before any
    download); otherwise installed bundles too.
    """
    lines = []
    for name, slot in bundles.enabled_slots(settings).items():
        override = getattr(settings, slot.override) is not None
        if overrides_only and not override:
            continue
        path = bundles.checkpoint_path(settings, name)
        where = f"{slot.variable}={path}" if override else f"bundle {name} (installed at {path})"
        for problem in _problems(path, slot.kind):
            lines.append(f"{where}: {problem}")
    return lines


def _raise(problems: list[str]) -> None:
    if len(problems) == 1:
        raise CheckpointError(problems[0])
    if problems:
        raise CheckpointError("\n  ".join(["checkpoints cannot be served:", *problems]))


def check_device(settings: Settings) -> None:
    """`DECIDEALOT_DEVICE=cuda` must name a GPU torch can use; raises ConfigError otherwise."""
    if settings.local_providers:
        from decidealot.device import check_cuda

        check_cuda(settings)


def prepare(settings: Settings, *, progress: bool, rehash: bool) -> None:
    """Everything before listening: the device, local checkpoints, bundles, then installed ones.

    Raises ConfigError, BundleError or CheckpointError with a message for the user.
    """
    if not settings.local_providers:
        return
    check_device(settings)
    _raise(checkpoint_problems(settings, overrides_only=True))
    bundles.prepare(settings, progress=progress, rehash=rehash)
    _raise(checkpoint_problems(settings))


ERRORS = (ConfigError, bundles.BundleError, CheckpointError)
"""What `prepare` raises for the user to read; the CLI prints it and exits non-zero."""
