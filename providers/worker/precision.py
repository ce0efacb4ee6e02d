"""The precision an engine computes in (`DECIDEALOT_PRECISION`, checked against the device the
worker resolved; `auto` chosen here, from the device and the CPU's flags), and what it reports
of each checkpoint it loads in it (`CheckpointLoad`: the scheduler turns each into a `Loaded`
frame for the gateway's metrics, log line and status view)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from decidealot import cpu
from decidealot.config import precision_problem
from decidealot.contract import Json
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
    """`auto` when unset (`decidealot.cpu.auto_precision`: `on_cuda` is what the engine's
    upstream runs on a GPU); refused (naming the setting) when `device` cannot run it, e.g.
    int8 once `DECIDEALOT_DEVICE=auto` resolved to cuda. The CPU's units are checked before
    listening (`decidealot.device.check_precision`), not here: an engine built in-process
    runs what it is asked, slowly where the units lack."""
    requested = str(options.get("precision", "auto"))
    problem = precision_problem(requested, device)
    if problem is not None:
        raise ValueError(f"DECIDEALOT_PRECISION: {problem}")
    if requested != "auto":
        return Chosen(requested, requested, "requested")
    flags = cpu.flags() if device == "cpu" else frozenset()
    return Chosen(requested, *cpu.auto_precision(device, flags, on_cuda))


@dataclass(frozen=True, slots=True)
class CheckpointLoad:
    """A checkpoint an engine loaded: its key and folder, the precision it runs in and why
    (`requested`: the setting), and which of its encoder's linear layers run int8."""

    checkpoint: str
    path: str
    precision: str
    linears: Quantised
    requested: str
    reason: str
    probe_fallback: bool = False
    """bf16 was chosen, but the load probe put the fp32 weights back."""


class LoadReports:
    """An engine's `CheckpointLoad`s not yet taken (`scheduler.ReportsLoads`): one per
    checkpoint it loads. Safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: list[CheckpointLoad] = []

    def add(
        self,
        checkpoint: str,
        path: str,
        chosen: Chosen,
        linears: Quantised,
        lowered: bf16.Lowered | None = None,
    ) -> None:
        """`lowered`: what bf16's load probe decided, where `chosen` is bf16 on a CPU."""
        precision, reason = chosen.precision, chosen.reason
        if lowered is not None and not lowered.bf16:
            precision = "fp32"
            reason += (
                f"; the load probe moved probabilities by {lowered.probe_error:.4f}, more than "
                f"{bf16.PROBE_TOLERANCE} under bf16, so it runs fp32"
            )
        load = CheckpointLoad(
            checkpoint,
            path,
            precision,
            linears,
            chosen.requested,
            reason,
            probe_fallback=precision != chosen.precision,
        )
        with self._lock:
            self._loads.append(load)

    def take(self) -> list[CheckpointLoad]:
        """The loads added since the last call."""
        with self._lock:
            loads, self._loads = self._loads, []
        return loads
