"""Random CLM head files in upstream's format (`torch.save` dict): answers carry no meaning."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import msgspec
import torch

from decidealot.providers.clm.descriptor import HEAD_FILE
from decidealot.providers.clm.gateway.provider import CHECKPOINT, QWEN3_8B_WIDTH
from decidealot.providers.clm.worker.engine import Head, HeadConfig

DEFAULT_LOGIT_SCALE = math.log(1 / 0.07)  # scale 14.3; above ln 100 exercises upstream's clamp


def _tower(generator: torch.Generator, cfg: HeadConfig) -> dict[str, torch.Tensor]:
    """Random weights for `Head(cfg)`, with LayerNorms that are not the identity."""
    with torch.device("meta"):  # shapes only: no memory, no draw from torch's global RNG
        shapes = {name: tensor.shape for name, tensor in Head(cfg).state_dict().items()}
    weights = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if name.startswith("norms."):
            weights[name] = noise * 0.3 + (1.0 if name.endswith(".weight") else 0.0)
        else:
            weights[name] = noise * (shape[-1] ** -0.5 if name.endswith(".weight") else 0.1)
    return weights


def build_clm_head(
    path: Path,
    *,
    hidden: int = 16,
    width: int = 24,
    proj: int = 8,
    depth: int = 3,
    activation: Literal["gelu", "relu", "silu"] = "gelu",
    layernorm: bool = True,
    residual: bool = False,
    logit_scale: float = DEFAULT_LOGIT_SCALE,
    seed: int = 0,
) -> Path:
    generator = torch.Generator().manual_seed(seed)
    cfg = HeadConfig(width, depth, proj, activation, layernorm, residual, hidden_size=hidden)
    checkpoint = {
        "state_head": _tower(generator, cfg),
        "action_head": _tower(generator, cfg),
        "logit_scale": torch.tensor(logit_scale),
        "cfg": {**msgspec.to_builtins(cfg), "lr": 3e-4},  # a training key the loader ignores
        "epoch": 7,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path


def write_bundles(root: Path) -> dict[str, Path]:
    """The bundle's head file at random: it reads Qwen3-8B's real width, its towers stay tiny."""
    path = root / CHECKPOINT / HEAD_FILE
    return {CHECKPOINT: build_clm_head(path, hidden=QWEN3_8B_WIDTH)}
