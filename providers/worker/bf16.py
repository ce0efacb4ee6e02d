"""bf16 on a CPU with bf16 units (`DECIDEALOT_PRECISION=bf16`, or what `auto` chose there).

Not autocast, which re-casts every weight on every pass, and not the whole model cast to bf16,
whose bf16 norms moved the hidden states 50x more than autocast did (max |d| 0.06 against
0.0017). The matrices are cast once, at load, halving their memory: every matrix product and
the attention run bf16, while the residual stream, every LayerNorm, RoPE's rotation and the
readout stay fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from decidealot.providers.worker.memory import release_freed

BF16 = torch.bfloat16

PROBE_TOLERANCE = 0.01  # most a probe probability may move under bf16, else fp32 (served: 0.02)


class Bf16Linear(nn.Module):
    """`nn.Linear` in bf16, input and output (the fp32 residual it is added to keeps fp32)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().to(BF16), requires_grad=False)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(BF16), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(BF16), self.weight, self.bias)


class Bf16Embedding(nn.Module):
    """`nn.Embedding` with its table in bf16, looked up as fp32 for the norm after it."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.weight = nn.Parameter(embedding.weight.detach().to(BF16), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).float()


@dataclass(frozen=True, slots=True)
class Lowered:
    bf16: bool
    probe_error: float  # the largest |dp| of the probe's probabilities


Site = tuple[nn.Module, str, nn.Module | nn.Parameter]  # (parent, attribute, its fp32 value)

PACKED = "bf16_parameters"
"""The class attribute naming a module's own parameters it reads with `F.linear`, casting its
input to their dtype (Laya's head attention: `in_proj_weight`, `in_proj_bias`)."""


def _sites(encoder: nn.Module, others: tuple[nn.Module, ...]) -> list[Site]:
    sites: list[Site] = [(encoder.embeddings, "tok_embeddings", encoder.embeddings.tok_embeddings)]
    for module in (encoder, *others):
        for parent in module.modules():
            for name in getattr(parent, PACKED, ()):
                sites.append((parent, name, getattr(parent, name)))
            for name, child in parent.named_children():
                if isinstance(child, nn.Linear):
                    sites.append((parent, name, child))
    return sites


def _lowered(held: nn.Module | nn.Parameter) -> nn.Module | nn.Parameter:
    if isinstance(held, nn.Parameter):
        return nn.Parameter(held.detach().to(BF16), requires_grad=False)
    if isinstance(held, nn.Linear):
        return Bf16Linear(held)
    assert isinstance(held, nn.Embedding), type(held)
    return Bf16Embedding(held)


def lower_guarded(
    encoder: nn.Module, probe: Callable[[], torch.Tensor], others: tuple[nn.Module, ...] = ()
) -> Lowered:
    """`encoder`'s linears and token embeddings, and `others`' linears and `PACKED` projections
    (Laya's head), in bf16, unless that moves `probe()` more than `PROBE_TOLERANCE`."""
    sites = _sites(encoder, others)
    with torch.inference_mode():
        reference = probe()
        for parent, name, module in sites:
            setattr(parent, name, _lowered(module))
        encoder.compute_dtype = BF16
        error = float((probe() - reference).abs().max())
        if error > PROBE_TOLERANCE:
            for parent, name, module in sites:
                setattr(parent, name, module)
            encoder.compute_dtype = torch.float32
    del sites, reference
    release_freed()
    return Lowered(error <= PROBE_TOLERANCE, error)
