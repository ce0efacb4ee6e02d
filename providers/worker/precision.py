"""The precision an engine computes in (`DECIDEALOT_PRECISION`, checked against the device the
worker resolved; `auto` chosen here, from the device and the CPU's flags), and what it reports
of each checkpoint it loads in it (`checkpoint_load`, for the gateway's metrics, log line and
status view)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from decidealot import cpu
from decidealot.config import precision_problem
from decidealot.contract import Json
from decidealot.jobs import CheckpointLoad
from decidealot.providers.worker import bf16
from decidealot.providers.worker.int8 import Quantised

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""Autocast dtype per CUDA precision; the others compute in fp32 (int8 only inside linears)."""


@dataclass(frozen=True, slots=True)
class Chosen:
    """The precision an engine loads its checkpoints in, the setting it came from, and why."""

    requested: str
    precision: str
    reason: str


def engine_precision(options: Mapping[str, Json], device: str, on_cuda: str = "fp32") -> Chosen:
    """`on_cuda`: what `auto` means on a GPU (what the engine's upstream runs there). Refused
    where `device` cannot run it (int8 once `auto` resolved to cuda); the CPU's units are checked
    before listening, not here: an engine built in-process runs what it is asked."""
    requested = str(options.get("precision", "auto"))
    problem = precision_problem(requested, device)
    if problem is not None:
        raise ValueError(f"DECIDEALOT_PRECISION: {problem}")
    if requested != "auto":
        return Chosen(requested, requested, "requested")
    flags = cpu.flags() if device == "cpu" else frozenset()
    return Chosen(requested, *cpu.auto_precision(device, flags, on_cuda))


def checkpoint_load(
    checkpoint: str,
    path: str,
    chosen: Chosen,
    linears: Quantised,
    lowered: bf16.Lowered | None = None,
) -> CheckpointLoad:
    """What an engine reports of a checkpoint it loaded in `chosen`'s precision; `lowered`:
    what bf16's load probe decided, where `chosen` is bf16 on a CPU."""
    precision, reason = chosen.precision, chosen.reason
    if lowered is not None and not lowered.bf16:
        precision = "fp32"
        reason += (
            f"; the load probe moved probabilities by {lowered.probe_error:.4f}, more than "
            f"{bf16.PROBE_TOLERANCE} under bf16, so it runs fp32"
        )
    return CheckpointLoad(
        checkpoint,
        path,
        precision,
        linears.linear_layers,
        linears.int8_layers,
        list(linears.kept),
        chosen.requested,
        reason,
        probe_fallback=precision != chosen.precision,
    )
