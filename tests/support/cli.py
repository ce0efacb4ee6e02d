"""The one way tests run the `decidealot` command: a fresh process, a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.servers import ROOT

NO_LOCAL = {"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_VON_ENABLED": "false"}
"""Settings that start no local provider (and so no bundle download)."""


def run_cli(
    *args: str,
    clear: tuple[str, ...] = ("DECIDEALOT_",),
    code: str | None = None,
    timeout: float = 120,
    wrapper: tuple[str, ...] = (),
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """`python -m decidealot ARGS` (or `python -c CODE ARGS`) with the variables starting with
    any of `clear` removed from this environment and `env` added, run by `wrapper` if given
    (a command that takes the command to run as its last arguments)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(clear)}
    command = ["-c", code, *args] if code is not None else ["-m", "decidealot", *args]
    return subprocess.run(
        [*wrapper, sys.executable, *command],
        cwd=ROOT,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
