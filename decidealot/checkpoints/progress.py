"""Download progress for huggingface_hub: a bar on a terminal, log lines otherwise."""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

log = logging.getLogger("decidealot.bundles")

_PROGRESS_LOG_SECONDS = 10.0


class _LogProgress(tqdm):
    """A tqdm that logs a line every few seconds (and at the end) instead of drawing a bar."""

    monitor_interval = 0  # no tqdm monitor thread

    def __init__(self, *args: Any, label: str, **kwargs: Any):
        kwargs.update(desc=label, mininterval=_PROGRESS_LOG_SECONDS, file=io.StringIO())
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if self.total:
            done, total = mb(self.n), mb(self.total)
            percent = 100.0 * self.n / self.total
            log.info("downloading %s: %s of %s (%.0f%%)", self.desc, done, total, percent)
        else:
            log.info("downloading %s: %s", self.desc, mb(self.n))
        return True


class _Bar(tqdm):
    def __init__(self, *args: Any, label: str, **kwargs: Any):
        super().__init__(*args, **(kwargs | {"desc": label, "unit_divisor": 1024}))


def progress_class(label: str, bar: bool) -> Callable[..., tqdm]:
    return functools.partial(_Bar if bar else _LogProgress, label=label)


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
