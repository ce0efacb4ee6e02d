"""Where each enabled bundle's checkpoint is: a local override, or the installed bundle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import decidealot.bundles
from decidealot import registry
from decidealot.config import Settings
from decidealot.registry import Bundle, Descriptor

SHIPPED_MANIFESTS = Path(decidealot.bundles.__file__).resolve().parent

TINY_HINT = (
    "`decidealot checkpoints tiny DIR` writes random checkpoints (answers carry no meaning) "
    "and prints the variables that use them, for trying the API offline"
)


def ownership_fix(folder: Path) -> str:
    """How to make `folder` writable by this process. A bind mount keeps its owner on the
    host (often root), and the images run as uid 10001, so the message names the uid and both
    ways out: the folder given to that uid, or the process run as the folder's owner."""
    uid, gid = os.getuid(), os.getgid()
    return (
        f"this process runs as uid {uid} (gid {gid}), which may not write there: give that uid "
        f"the folder (`chown -R {uid}:{gid} {folder}`; for a bind mount, on the host's folder), "
        "or run as the folder's owner (`docker run --user UID:GID`, Compose's `user:`)"
    )


class Placed(NamedTuple):
    provider: Descriptor
    bundle: Bundle

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def replacement(self) -> str:
        """What replaces the download: a local checkpoint, or the provider turned off."""
        what = "file" if self.bundle.entry else "directory"
        return (
            f"set {self.bundle.variable} to a local checkpoint {what}, "
            f"or {self.provider.switch_off}"
        )

    def override(self, settings: Settings) -> Path | None:
        return getattr(self.provider.of(settings), self.bundle.setting)  # type: ignore[no-any-return]

    def path(self, settings: Settings) -> Path:
        """The path the provider loads: the local override when set, else the installed one."""
        override = self.override(settings)
        if override is not None:
            return override
        installed = settings.model_dir / self.bundle.name
        return installed / self.bundle.entry if self.bundle.entry else installed

    def manifests(self, settings: Settings) -> Path:
        return settings.bundle_manifest_dir or self.bundle.manifests or SHIPPED_MANIFESTS


def every_bundle() -> list[Placed]:
    return [Placed(d, b) for d in registry.registered() for b in d.bundles]


def enabled_bundles(settings: Settings) -> list[Placed]:
    """The bundles this configuration serves, downloaded or replaced by a local checkpoint."""
    return [Placed(d, b) for d in registry.enabled(settings) for b in d.bundles]


def to_download(settings: Settings) -> list[Placed]:
    """The enabled bundles no local checkpoint replaces: what `install.install_enabled` fetches."""
    return [p for p in enabled_bundles(settings) if p.override(settings) is None]


def with_checkpoints(settings: Settings) -> Settings:
    """`settings` with every checkpoint setting filled (its override, else the installed
    bundle's path), so providers read paths from settings and never look at bundles."""
    return registry.replace(
        settings, **{p.bundle.setting: p.path(settings) for p in every_bundle()}
    )
