"""Reduced-precision passes (`DECIDEALOT_PRECISION`): CUDA autocast dtypes, and int8 weights
for an encoder's linear layers on CPU.

Each chosen `nn.Linear` becomes an `Int8Linear`: weights int8 per output channel, activations
quantised per token (symmetric, from that token's own largest value), multiplied by
`torch._int_mm` into int32 and scaled back to fp32. Per-token scales keep a row's answers
independent of what it is batched or padded with, which per-tensor dynamic quantisation (torch's
`quantize_dynamic`, ONNX Runtime's) does not. Measurements, and the candidates not kept, are in
docs/performance.md ("Engine candidates"). Worker-side only.

`quantize_guarded` checks the result on a probe before serving it: layers whose int8 error
moves the probe's probabilities most go back to fp32 until the probe is within tolerance (on
the wide random test checkpoints the query/key projections must; on base-shaped weights none).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""Autocast dtype per CUDA precision; the others compute in fp32 (int8 only inside linears)."""

INT8_MAX = 127.0

PROBE_TOLERANCE = 0.01
"""Most a probe probability may move under int8; the served bound is 0.05 (tests)."""

PROBE_ROWS = 8
"""Random rows in the probe, four option markers each."""

PROBE_LENGTH = 256
"""Tokens per probe row (at most a checkpoint's row budget): about a typical row's length."""


class Int8Linear(nn.Module):
    """`y = x W^T + b` with W int8 per output channel and x int8 per token."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.fp32 = linear
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / INT8_MAX
        quantised = torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)
        # [in, out] row-major: the faster of torch._int_mm's CPU layouts (measured).
        self.register_buffer("weight_t", quantised.to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12).div_(INT8_MAX)
        quantised = torch.round(flat / scale).to(torch.int8)
        out = torch._int_mm(quantised, self.weight_t).float().mul_(scale).mul_(self.weight_scale)
        if self.fp32.bias is not None:
            out.add_(self.fp32.bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def _linears(module: nn.Module) -> dict[str, list[tuple[nn.Module, str]]]:
    """Every `nn.Linear` under `module` as (parent, attribute), grouped by attribute name (its
    role in each layer: e.g. ModernBERT's `Wqkv`, `Wo`, `Wi`)."""
    roles: dict[str, list[tuple[nn.Module, str]]] = {}
    for parent in module.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                roles.setdefault(name, []).append((parent, name))
    return roles


def _set(sites: list[tuple[nn.Module, str]], int8: bool) -> None:
    for parent, name in sites:
        child = getattr(parent, name)
        if int8 and isinstance(child, nn.Linear):
            setattr(parent, name, Int8Linear(child))
        elif not int8 and isinstance(child, Int8Linear):
            setattr(parent, name, child.fp32)


def quantize_guarded(target: nn.Module, probe: Callable[[], torch.Tensor]) -> list[str]:
    """Make `target`'s linear layers int8, keeping fp32 the roles whose int8 error moves
    `probe()` (probabilities, computed through `target`) most, until it moves at most
    `PROBE_TOLERANCE`. Returns the roles left in fp32."""
    roles = _linears(target)
    with torch.inference_mode():
        reference = probe()

        def error() -> float:
            return float((probe() - reference).abs().max())

        for sites in roles.values():
            _set(sites, True)
        if error() <= PROBE_TOLERANCE:
            return []
        alone: dict[str, float] = {}
        for role in roles:  # each role's int8 error on its own
            for other, others in roles.items():
                _set(others, other == role)
            alone[role] = error()
        for sites in roles.values():
            _set(sites, True)
        kept: list[str] = []
        for role in sorted(roles, key=alone.__getitem__, reverse=True):
            if error() <= PROBE_TOLERANCE:
                break
            _set(roles[role], False)
            kept.append(role)
    return kept
