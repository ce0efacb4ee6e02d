"""int8 weights for an encoder's linear layers on CPU (`DECIDEALOT_PRECISION=int8`).

Activations are quantised per token: that keeps a row's answers independent of what it is
batched or padded with, which per-tensor dynamic quantisation (torch's `quantize_dynamic`, ONNX
Runtime's) does not (docs/performance.md, "Engine candidates"). On the wide random test
checkpoints the load probe puts the query/key projections back to fp32; on base-shaped none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from decidealot.providers.worker.memory import release_freed

INT8_MAX = 127.0
PROBE_TOLERANCE = 0.01  # most a probe probability may move under int8 (served bound: 0.05)
PROBE_ROWS = 8  # random rows in the probe, four option markers each
PROBE_LENGTH = 256  # tokens per probe row (at most a row budget): a typical row's length


class Int8Linear(nn.Module):
    """`y = x W^T + b`, W int8 per output channel, x per token. Of its `nn.Linear` it keeps the
    bias only: the fp32 weight is freed with the linear (kept while the probe decides)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        scale = weight.abs().amax(dim=1).float().clamp_min(1e-12) / INT8_MAX
        quantised = (weight / scale[:, None]).round_().clamp_(-INT8_MAX, INT8_MAX)
        # [in, out] row-major: the faster of torch._int_mm's CPU layouts (measured).
        self.register_buffer("weight_t", quantised.to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_parameter("bias", linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12).div_(INT8_MAX)
        quantised = torch.round(flat / scale).to(torch.int8)
        out = torch._int_mm(quantised, self.weight_t).float().mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])


@dataclass(frozen=True, slots=True)
class Quantised:
    """What `quantize_guarded` left; `kept`: the roles kept fp32, worst probe error first."""

    linear_layers: int
    int8_layers: int
    kept: tuple[str, ...]


def _linears(module: nn.Module) -> dict[str, list[tuple[nn.Module, str]]]:
    """Every `nn.Linear` under `module` as (parent, attribute), by role (`Wqkv`, `Wo`, `Wi`)."""
    roles: dict[str, list[tuple[nn.Module, str]]] = {}
    for parent in module.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                roles.setdefault(name, []).append((parent, name))
    return roles


def unquantised(module: nn.Module) -> Quantised:
    """What a precision other than int8 leaves: every `nn.Linear` under `module` in fp32."""
    return Quantised(sum(len(sites) for sites in _linears(module).values()), 0, ())


def quantize_guarded(target: nn.Module, probe: Callable[[], torch.Tensor]) -> Quantised:
    """`target`'s linear layers in int8, but the roles whose int8 error moves `probe()` most,
    kept fp32 until it moves at most `PROBE_TOLERANCE`; the versions not chosen are freed."""
    roles = _linears(target)
    kept = _choose(roles, probe)
    total = sum(len(sites) for sites in roles.values())
    release_freed()
    return Quantised(total, total - sum(len(roles[role]) for role in kept), tuple(kept))


def _choose(
    roles: dict[str, list[tuple[nn.Module, str]]], probe: Callable[[], torch.Tensor]
) -> list[str]:
    """Leave each role int8 or fp32 in its parents; the roles kept fp32."""
    fp32 = {
        role: [getattr(parent, name) for parent, name in sites] for role, sites in roles.items()
    }
    int8 = {role: [Int8Linear(linear) for linear in layers] for role, layers in fp32.items()}

    def use(role: str, quantised: bool) -> None:
        chosen = int8[role] if quantised else fp32[role]
        for (parent, name), layer in zip(roles[role], chosen, strict=True):
            setattr(parent, name, layer)

    with torch.inference_mode():
        reference = probe()

        def error() -> float:
            return float((probe() - reference).abs().max())

        for role in roles:
            use(role, True)
        if error() <= PROBE_TOLERANCE:
            return []
        alone: dict[str, float] = {}
        for role in roles:  # each role's int8 error on its own
            for other in roles:
                use(other, other == role)
            alone[role] = error()
        for role in roles:
            use(role, True)
        kept: list[str] = []
        for role in sorted(roles, key=alone.__getitem__, reverse=True):
            if error() <= PROBE_TOLERANCE:
                break
            use(role, False)
            kept.append(role)
    return kept
