"""The CLM projection heads and their checkpoint file (worker side; imports torch).

`CLM_v0.1-8B.pt` is a `torch.save` dict of `state_head` and `action_head` (two same-shaped
MLPs, parameter names as upstream's so its files load strictly), `logit_scale` and `cfg`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import torch
from torch import nn

MAX_SCALE = 100.0
"""Upstream caps exp(logit_scale) at 100."""

_ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU}


class HeadFileError(ValueError):
    """The head file cannot be used; the worker fails to start with this message."""


class HeadConfig(msgspec.Struct, frozen=True):
    """The `cfg` keys the architecture needs; training's extra keys are ignored."""

    width: int
    depth: Annotated[int, msgspec.Meta(ge=2)]
    projection_dim: int = 512
    activation: Literal["gelu", "relu", "silu"] = "gelu"
    layernorm: bool = False
    residual: bool = False
    hidden_size: int = 4096


class Head(nn.Module):
    """hidden -> width -> (depth - 2 blocks of Linear, LayerNorm?, act) -> projection, unit norm."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        blocks = cfg.depth - 2
        self.inp = nn.Linear(cfg.hidden_size, cfg.width)
        self.hidden = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(blocks))
        self.norms = nn.ModuleList(
            nn.LayerNorm(cfg.width) if cfg.layernorm else nn.Identity() for _ in range(blocks)
        )
        self.out = nn.Linear(cfg.width, cfg.projection_dim)
        self.act = _ACTIVATIONS[cfg.activation]()
        self.residual = cfg.residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.inp(x))
        for linear, norm in zip(self.hidden, self.norms, strict=True):
            t = self.act(norm(linear(h)))
            h = h + t if self.residual else t
        return nn.functional.normalize(self.out(h), dim=-1)


@dataclass(frozen=True)
class HeadPair:
    """Both towers of one checkpoint, ready on their device."""

    state: Head
    action: Head
    scale: float
    """min(exp(logit_scale), 100)."""
    cfg: HeadConfig


def load_heads(path: Path, device: str) -> HeadPair:
    """Load a head file weights-only; raise HeadFileError for anything unusable."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise HeadFileError(
            f"CLM head {path.name} was refused by weights-only loading (it holds objects "
            f"other than tensors and plain values): {exc}"
        ) from exc
    except (OSError, RuntimeError) as exc:
        raise HeadFileError(f"CLM head {path.name} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise HeadFileError(f"CLM head {path.name} is not a checkpoint dict")
    raw = data.get("cfg")
    if not isinstance(raw, dict):
        raise HeadFileError(f"CLM head {path.name} has no cfg dict")
    fields = dict(raw)
    if "projection_dim" in data:  # upstream: a top-level projection_dim wins over cfg's
        fields["projection_dim"] = data["projection_dim"]
    try:
        cfg = msgspec.convert(fields, HeadConfig)
    except msgspec.ValidationError as exc:
        raise HeadFileError(f"CLM head {path.name} has an unusable cfg: {exc}") from exc
    if "logit_scale" not in data:
        raise HeadFileError(f"CLM head {path.name} has no logit_scale")
    logit_scale = torch.as_tensor(data["logit_scale"]).float()
    return HeadPair(
        state=_tower(data, "state_head", cfg, path.name, device),
        action=_tower(data, "action_head", cfg, path.name, device),
        scale=float(logit_scale.exp().clamp(max=MAX_SCALE)),
        cfg=cfg,
    )


def _tower(data: dict[str, object], key: str, cfg: HeadConfig, name: str, device: str) -> Head:
    weights = data.get(key)
    if not isinstance(weights, dict):
        raise HeadFileError(f"CLM head {name} has no {key} state dict")
    tower = Head(cfg)
    try:
        tower.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        raise HeadFileError(f"CLM head {name}: {key} does not match its cfg: {exc}") from exc
    return tower.eval().to(device)
