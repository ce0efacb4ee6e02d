"""Random CLM head files in upstream's format (`torch.save` dict), for tests only."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import torch

from providers.clm.engine import create
from providers.engine import Decision, EngineSpec, Job

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


class InProcessClmRunner:
    """A `LocalRuntime` that runs the CLM engine in this process, round-tripping jobs and
    decisions through msgpack as the worker's frames would."""

    name = "clm"
    device = "cpu"
    loaded = True

    def __init__(self, head: Path, *, width: int):
        spec = EngineSpec(
            factory="providers.clm.engine:create",
            checkpoints={"clm-0.1-8b": str(head)},
            options={"width": width},
        )
        self.engine = create(spec)
        self.jobs = 0

    async def load(self) -> None:
        pass

    async def unload(self) -> None:
        pass

    async def submit(self, job: Job) -> Decision:
        self.jobs += 1
        wire_job = msgspec.msgpack.decode(msgspec.msgpack.encode(job), type=Job)
        decision = self.engine.run([self.engine.prepare(wire_job)])[0]
        return msgspec.msgpack.decode(msgspec.msgpack.encode(decision), type=Decision)
