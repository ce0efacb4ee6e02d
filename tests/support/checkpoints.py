"""Tiny random checkpoints for the whole session: each distinct one is written once.

Tests ask the session's `tiny` fixture (tests/conftest.py) for a checkpoint by what it is (a
Laya variant and seed, a Von mode, a CLM head's shape); the same request gets the same folder,
so files that want the same checkpoint share it. Builders are `decidealot checkpoints tiny`'s
own (`decidealot.providers.<p>.tiny`), imported on first use: torch loads only for the tests
that need a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TinyCheckpoints:
    def __init__(self, root: Path) -> None:
        self._root = root
        self._made: dict[str, Path] = {}
        self._lock = threading.Lock()

    def _once(self, kind: str, build: Any, name: str, **options: Any) -> Path:
        key = kind + json.dumps(options, sort_keys=True, default=str)
        with self._lock:
            if key not in self._made:
                digest = hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:10]
                self._made[key] = build(self._root / f"{kind}-{digest}" / name, **options)
            return self._made[key]

    def laya(self, variant: str, **options: Any) -> Path:
        """`build_laya_checkpoint(path, variant, **options)`, written once."""
        from decidealot.providers.laya.tiny import build_laya_checkpoint

        return self._once("laya", build_laya_checkpoint, variant, variant=variant, **options)

    def laya_all(self, **options: Any) -> dict[str, Path]:
        """Every Laya variant, with `options` (a seed per variant: `seeds={...}`)."""
        from decidealot.providers.laya.tiny import VARIANTS

        seeds: dict[str, int] = options.pop("seeds", {})
        return {v: self.laya(v, seed=seeds.get(v, 0), **options) for v in VARIANTS}

    def von(self, **options: Any) -> Path:
        """`build_von_checkpoint(path, **options)`, written once."""
        from decidealot.providers.von.tiny import build_von_checkpoint

        return self._once("von", build_von_checkpoint, "von", **options)

    def clm(self, **options: Any) -> Path:
        """`build_clm_head(path, **options)`, written once."""
        from decidealot.providers.clm.tiny import build_clm_head

        return self._once("clm", build_clm_head, "head.pt", **options)


def laya_settings(paths: Mapping[str, Path]) -> dict[str, str]:
    """The `DECIDEALOT_LAYA_<VARIANT>_CHECKPOINT` settings that serve each of `paths`
    (variant -> folder, as `TinyCheckpoints.laya_all` gives them)."""
    return {
        f"DECIDEALOT_LAYA_{variant.upper().replace('-', '_')}_CHECKPOINT": str(path)
        for variant, path in paths.items()
    }
