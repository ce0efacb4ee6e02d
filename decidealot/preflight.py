"""Checks `serve` and `prepare` run before anything listens: device, bundles, checkpoint files;
no torch. Each would otherwise start and fail every request with a worker traceback (a file its
engine cannot read, no GPU, bf16 without its CPU units), so each is told here in one message
naming the setting or bundle.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from decidealot import config, registry
from decidealot.checkpoints import install
from decidealot.checkpoints.manifest import BundleError
from decidealot.checkpoints.paths import Placed, enabled_bundles
from decidealot.config import ConfigError, Settings
from decidealot.device import check_cuda, check_precision
from decidealot.registry import Calibration, Descriptor, FileCheck

log = logging.getLogger("decidealot.preflight")


class CheckpointError(Exception):
    """Checkpoints that cannot be served; the message names each setting or bundle and file."""


def _problems(path: Path, placed: Placed) -> list[str]:
    bundle = placed.bundle
    if bundle.entry:
        if not path.is_file():
            return [f"the {bundle.entry_is} is missing"]
        if path.stat().st_size == 0:
            return [f"the {bundle.entry_is} is empty"]
        files = [(f"the {bundle.entry_is}", bundle.entry, path)]
    elif not path.is_dir():
        return ["the directory is missing"]
    else:
        files = [(name, name, path / name) for name in bundle.files]
    reads = f"(the {placed.provider.name.capitalize()} engine reads it)"
    problems = []
    for what, name, file in files:
        if not file.is_file():
            problems.append(f"{what} is missing {reads}")
        elif (problem := _read(bundle.checks.get(name), file)) is not None:
            problems.append(f"{what} {problem} {reads}")
    return problems


def _read(check: FileCheck | None, path: Path) -> str | None:
    try:
        return check(path) if check is not None else None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"


def checkpoint_problems(settings: Settings, *, overrides_only: bool = False) -> list[str]:
    """One line per enabled checkpoint that lacks a file its engine reads; `overrides_only`:
    only the local checkpoints the settings name (checked before any download)."""
    lines = []
    for placed in enabled_bundles(settings):
        override = placed.override(settings) is not None
        if overrides_only and not override:
            continue
        path = placed.path(settings)
        where = f"bundle {placed.name} (installed at {path})"
        if override:
            where = f"{placed.bundle.variable}={path}"
        lines += [f"{where}: {problem}" for problem in _problems(path, placed)]
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


def _calibrations(settings: Settings) -> Iterator[tuple[Descriptor, Calibration, str | None]]:
    for descriptor in registry.enabled_local(settings):
        files = descriptor.calibration_files(descriptor.of(settings))
        for calibration in descriptor.calibrations:
            yield descriptor, calibration, files.get(calibration.key)


def calibration_problems(settings: Settings) -> list[str]:
    """One line per calibration file set for an enabled checkpoint that its engine would refuse."""
    lines = []
    for descriptor, calibration, path in _calibrations(settings):
        problem = None if path is None else _read(calibration.check, Path(path))
        if problem is not None:
            lines.append(
                f"{config.variable(calibration.setting)}={path}: {problem} "
                f"(the {descriptor.name.capitalize()} engine would not load it)"
            )
    return lines


def report_calibrations(settings: Settings) -> None:
    """Log which calibration each enabled checkpoint runs with, and what its upstream package
    warns of on loading that file (one fitted for another checkpoint, clamped temperatures)."""
    placed = {p.name: p for p in enabled_bundles(settings)}
    for _, calibration, path in _calibrations(settings):
        bundle = placed[calibration.bundle]
        variable = config.variable(calibration.setting)
        if path is None:
            log.info("%s runs with its checkpoint's own calibration", bundle.name)
            continue
        log.info("%s runs with calibration %s=%s", bundle.name, variable, path)
        for warning in calibration.warnings(Path(path), bundle.path(settings)):
            log.warning("%s=%s: %s", variable, path, warning)


def raise_all(problems: list[str]) -> None:
    if len(problems) == 1:
        raise CheckpointError(problems[0])
    if problems:
        raise CheckpointError("\n  ".join(["checkpoints cannot be served:", *problems]))


def check_device(settings: Settings) -> None:
    """ConfigError unless torch has the GPU `cuda` names and the device runs the precision."""
    if registry.enabled_local(settings):
        check_cuda(settings)
        check_precision(settings)


def ready_to_serve(settings: Settings, *, progress: bool, rehash: bool) -> None:
    """Everything before listening: the device, local checkpoints, bundles, then installed ones."""
    if not registry.enabled_local(settings):
        return
    check_device(settings)
    raise_all(calibration_problems(settings) + checkpoint_problems(settings, overrides_only=True))
    install.install_enabled(settings, progress=progress, rehash=rehash)
    raise_all(checkpoint_problems(settings))
    report_calibrations(settings)


ERRORS = (ConfigError, BundleError, CheckpointError)  # the CLI prints them, exits non-zero
