"""Checks `serve` and `prepare` run before anything listens: device, bundles, checkpoint files.

A checkpoint directory that lacks a file its engine reads, or holds one its engine cannot parse
(each bundle declares how its files are read: `decidealot.registry.Bundle.checks`), would
otherwise start, and fail every request to it with a worker traceback (a calibration file set
for a checkpoint too); `DECIDEALOT_DEVICE=cuda` on a machine where torch sees no GPU would start
a worker that fails every pass, and bf16 or int8 on a CPU without their units one many times
slower than fp32. Each is told
here, in one message naming the setting (or bundle) and the file. Nothing here imports torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

from decidealot import config, registry
from decidealot.checkpoints import install
from decidealot.checkpoints.manifest import BundleError
from decidealot.checkpoints.paths import Placed, enabled_bundles
from decidealot.config import ConfigError, Settings
from decidealot.device import check_cuda, check_precision
from decidealot.registry import FileCheck

log = logging.getLogger("decidealot.preflight")


class CheckpointError(Exception):
    """Checkpoints that cannot be served; the message names each setting or bundle and file."""


def _problems(path: Path, placed: Placed) -> list[str]:
    bundle = placed.bundle
    engine = placed.provider.name.capitalize()
    if bundle.entry:
        if not path.is_file():
            return [f"the {bundle.entry_is} is missing"]
        if path.stat().st_size == 0:
            return [f"the {bundle.entry_is} is empty"]
        return _contents(bundle.checks.get(bundle.entry), path, f"the {bundle.entry_is}", engine)
    if not path.is_dir():
        return ["the directory is missing"]
    problems = []
    for name in bundle.files:
        if not (path / name).is_file():
            problems.append(f"{name} is missing (the {engine} engine reads it)")
        else:
            problems += _contents(bundle.checks.get(name), path / name, name, engine)
    return problems


def _contents(check: FileCheck | None, path: Path, what: str, engine: str) -> list[str]:
    """What the bundle's own check of this file finds wrong in its contents."""
    try:
        problem = check(path) if check is not None else None
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or type(exc).__name__})"
    return [] if problem is None else [f"{what} {problem} (the {engine} engine reads it)"]


def checkpoint_problems(settings: Settings, *, overrides_only: bool = False) -> list[str]:
    """One line per enabled checkpoint that lacks a file its engine reads.

    With `overrides_only`, only the local checkpoints the settings name (checked before any
    download); otherwise installed bundles too.
    """
    lines = []
    for placed in enabled_bundles(settings):
        override = placed.override(settings) is not None
        if overrides_only and not override:
            continue
        path = placed.path(settings)
        where = (
            f"{placed.bundle.variable}={path}"
            if override
            else f"bundle {placed.name} (installed at {path})"
        )
        for problem in _problems(path, placed):
            lines.append(f"{where}: {problem}")
    return lines


def checked_checkpoint(settings: Settings, bundle: str) -> Path:
    """Where enabled `bundle`'s checkpoint is, checked as startup checks it, without
    downloading anything; CheckpointError naming the setting or bundle otherwise."""
    for placed in enabled_bundles(settings):
        if placed.name != bundle:
            continue
        path = placed.path(settings)
        override = placed.override(settings) is not None
        where = f"{placed.bundle.variable}={path}" if override else f"bundle {bundle}"
        if not override and not path.exists():
            raise CheckpointError(
                f"bundle {bundle} is not installed: `decidealot prepare` installs it, "
                f"or {placed.replacement}"
            )
        raise_all([f"{where}: {problem}" for problem in _problems(path, placed)])
        return path
    raise CheckpointError(f"bundle {bundle} is not enabled")


def calibration_problems(settings: Settings) -> list[str]:
    """One line per calibration file set for an enabled checkpoint that its engine would refuse,
    naming the setting and the file."""
    lines = []
    for descriptor in registry.enabled_local(settings):
        section = descriptor.of(settings)
        for calibration in descriptor.calibrations:
            path: Path | None = getattr(section, calibration.setting)
            if path is None:
                continue
            try:
                problem = calibration.check(path)
            except OSError as exc:
                problem = f"cannot be read ({exc.strerror or type(exc).__name__})"
            if problem is not None:
                engine = descriptor.name.capitalize()
                lines.append(
                    f"{config.variable(calibration.setting)}={path}: {problem} "
                    f"(the {engine} engine would not load it)"
                )
    return lines


def report_calibrations(settings: Settings) -> None:
    """Log which calibration each enabled checkpoint runs with, and what its upstream package
    warns of on loading that file (one fitted for another checkpoint, clamped temperatures)."""
    placed = {p.name: p for p in enabled_bundles(settings)}
    for descriptor in registry.enabled_local(settings):
        section = descriptor.of(settings)
        for calibration in descriptor.calibrations:
            bundle = placed.get(calibration.bundle)
            if bundle is None:
                continue
            path: Path | None = getattr(section, calibration.setting)
            variable = config.variable(calibration.setting)
            if path is None:
                log.info("%s runs with its checkpoint's own calibration", bundle.name)
                continue
            log.info("%s runs with calibration %s=%s", bundle.name, variable, path)
            for warning in calibration.warnings(path, bundle.path(settings)):
                log.warning("%s=%s: %s", variable, path, warning)


def raise_all(problems: list[str]) -> None:
    """One CheckpointError telling every problem, if there are any."""
    if len(problems) == 1:
        raise CheckpointError(problems[0])
    if problems:
        raise CheckpointError("\n  ".join(["checkpoints cannot be served:", *problems]))


def check_device(settings: Settings) -> None:
    """`DECIDEALOT_DEVICE=cuda` must name a GPU torch can use, and `DECIDEALOT_PRECISION` a
    precision the device (on CPU, its units) runs; raises ConfigError otherwise."""
    if registry.enabled_local(settings):
        check_cuda(settings)
        check_precision(settings)


def ready_to_serve(settings: Settings, *, progress: bool, rehash: bool) -> None:
    """Everything before listening: the device, local checkpoints, bundles, then installed ones.

    Raises ConfigError, BundleError or CheckpointError with a message for the user.
    """
    if not registry.enabled_local(settings):
        return
    check_device(settings)
    raise_all(calibration_problems(settings) + checkpoint_problems(settings, overrides_only=True))
    install.install_enabled(settings, progress=progress, rehash=rehash)
    raise_all(checkpoint_problems(settings))
    report_calibrations(settings)


ERRORS = (ConfigError, BundleError, CheckpointError)
"""What `prepare` raises for the user to read; the CLI prints it and exits non-zero."""
