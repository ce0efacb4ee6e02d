"""Random CLM head files in upstream's format (`torch.save` dict): answers carry no meaning."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from decidealot.providers.clm.descriptor import HEAD_FILE
from decidealot.providers.clm.gateway.provider import CHECKPOINT, QWEN3_8B_WIDTH

DEFAULT_LOGIT_SCALE = math.log(1 / 0.07)
"""scale ≈ 14.3: readable probabilities. Pass > ln 100 to exercise upstream's clamp."""


def _tower(
    generator: torch.Generator, *, hidden: int, width: int, proj: int, depth: int, layernorm: bool
) -> dict[str, torch.Tensor]:
    def randn(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    weights = {
        "inp.weight": randn(width, hidden, std=hidden**-0.5),
        "inp.bias": randn(width, std=0.1),
        "out.weight": randn(proj, width, std=width**-0.5),
        "out.bias": randn(proj, std=0.1),
    }
    for block in range(depth - 2):
        weights[f"hidden.{block}.weight"] = randn(width, width, std=width**-0.5)
        weights[f"hidden.{block}.bias"] = randn(width, std=0.1)
        if layernorm:  # not the identity: weight ~ N(1, 0.3), bias ~ N(0, 0.3)
            weights[f"norms.{block}.weight"] = 1 + randn(width, std=0.3)
            weights[f"norms.{block}.bias"] = randn(width, std=0.3)
    return weights


def build_clm_head(
    path: Path,
    *,
    hidden: int = 16,
    width: int = 24,
    proj: int = 8,
    depth: int = 3,
    activation: str = "gelu",
    layernorm: bool = True,
    residual: bool = False,
    logit_scale: float = DEFAULT_LOGIT_SCALE,
    seed: int = 0,
) -> Path:
    """Write two independent random towers, `logit_scale` and `cfg` to `path`."""
    generator = torch.Generator().manual_seed(seed)
    shape = {"hidden": hidden, "width": width, "proj": proj, "depth": depth, "layernorm": layernorm}
    checkpoint = {
        "state_head": _tower(generator, **shape),
        "action_head": _tower(generator, **shape),
        "logit_scale": torch.tensor(logit_scale),
        "cfg": {
            "width": width,
            "depth": depth,
            "projection_dim": proj,
            "activation": activation,
            "layernorm": layernorm,
            "residual": residual,
            "hidden_size": hidden,
            "lr": 3e-4,  # training keys the loader must ignore
        },
        "epoch": 7,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path


def write_bundles(root: Path) -> dict[str, Path]:
    """The bundle's head file at random: it reads Qwen3-8B's real width, its towers stay tiny."""
    path = root / CHECKPOINT / HEAD_FILE
    return {CHECKPOINT: build_clm_head(path, hidden=QWEN3_8B_WIDTH)}
