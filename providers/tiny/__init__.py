"""Small random checkpoints of every local model, in the upstream on-disk formats.

One code path for the test suite, the benchmarks and `decidealot checkpoints tiny DIR`: each
builder writes exactly the files the upstream package and our engine load, with random weights,
so the answers they give carry no meaning. They are for smoke tests, client CI and trying the
API offline; torch is imported here, so only the CLI and workers import this package.
"""

from __future__ import annotations

from pathlib import Path

from decidealot.providers.tiny.clm import build_clm_head
from decidealot.providers.tiny.laya import VARIANTS as LAYA_VARIANTS
from decidealot.providers.tiny.laya import build_laya_checkpoint
from decidealot.providers.tiny.von import build_von_checkpoint

CLM_HEAD_FILE = "CLM_v0.1-8B.pt"
CLM_HIDDEN = 4096
"""The head reads Qwen3-8B vectors, so its input width is the real one; the towers stay tiny."""


def write_checkpoints(directory: Path) -> dict[str, Path]:
    """Write one random checkpoint per local bundle under `directory`; bundle name -> path.

    Von is written in plain (joint-attention) mode with the scalar temperature of the 1.1
    candidate, as the `von-1.1` bundle serves it.
    """
    paths: dict[str, Path] = {}
    for variant in LAYA_VARIANTS:
        paths[f"laya-{variant}"] = build_laya_checkpoint(directory / f"laya-{variant}", variant)
    paths["von-1.1"] = build_von_checkpoint(
        directory / "von-1.1",
        independent_options=False,
        digit_split=False,
        calibration_map=None,
        noul_prior=None,
        temperature=2.2,
    )
    paths["clm-0.1-8b"] = build_clm_head(
        directory / "clm-0.1-8b" / CLM_HEAD_FILE, hidden=CLM_HIDDEN
    )
    return paths
