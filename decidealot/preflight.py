"""Checks `serve` and `prepare` run before anything listens: device, bundles, checkpoint files.

A checkpoint directory that lacks a file its engine reads, or holds one its engine cannot parse
(each bundle declares how its files are read: `decidealot.registry.Bundle.checks`), would
otherwise start, and fail every request to it with a worker traceback; `DECIDEALOT_DEVICE=cuda`
on a machine where torch sees no GPU would start a worker that fails every pass. Both are told
here, in one message naming the setting (or bundle) and the file. Nothing here imports torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

from decidealot import registry
from decidealot.checkpoints import install
from decidealot.checkpoints.manifest import BundleError
from decidealot.checkpoints.paths import Placed, enabled_bundles
from decidealot.config import ConfigError, Settings
from decidealot.device import check_cuda
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


def _raise(problems: list[str]) -> None:
    if len(problems) == 1:
        raise CheckpointError(problems[0])
    if problems:
        raise CheckpointError("\n  ".join(["checkpoints cannot be served:", *problems]))


def check_device(settings: Settings) -> None:
    """`DECIDEALOT_DEVICE=cuda` must name a GPU torch can use; raises ConfigError otherwise."""
    if registry.enabled_local(settings):
        check_cuda(settings)


def ready_to_serve(settings: Settings, *, progress: bool, rehash: bool) -> None:
    """Everything before listening: the device, local checkpoints, bundles, then installed ones.

    Raises ConfigError, BundleError or CheckpointError with a message for the user.
    """
    if not registry.enabled_local(settings):
        return
    check_device(settings)
    _raise(checkpoint_problems(settings, overrides_only=True))
    install.install_enabled(settings, progress=progress, rehash=rehash)
    _raise(checkpoint_problems(settings))


ERRORS = (ConfigError, BundleError, CheckpointError)
"""What `prepare` raises for the user to read; the CLI prints it and exits non-zero."""
