"""The precision an engine computes in (`DECIDEALOT_PRECISION`, checked against the device the
worker resolved), and what it reports of each checkpoint it loads in it (`CheckpointLoad`: the
scheduler turns each into a `Loaded` frame for the gateway's metrics and log)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from decidealot.config import precision_problem
from decidealot.contract import Json
from decidealot.providers.worker.int8 import Quantised

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""Autocast dtype per CUDA precision; the others compute in fp32 (int8 only inside linears)."""


def engine_precision(options: Mapping[str, Json], device: str) -> str:
    """fp32 when unset; refused (naming the setting) when `device` cannot run it, e.g. int8
    once `DECIDEALOT_DEVICE=auto` resolved to cuda."""
    precision = options.get("precision", "fp32")
    problem = precision_problem(str(precision), device)
    if problem is not None:
        raise ValueError(f"DECIDEALOT_PRECISION: {problem}")
    return str(precision)


@dataclass(frozen=True, slots=True)
class CheckpointLoad:
    """A checkpoint an engine loaded: its key and folder, its precision, and which of its
    encoder's linear layers run int8."""

    checkpoint: str
    path: str
    precision: str
    linears: Quantised


class LoadReports:
    """An engine's `CheckpointLoad`s not yet taken (`scheduler.ReportsLoads`): one per
    checkpoint it loads. Safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: list[CheckpointLoad] = []

    def add(self, checkpoint: str, path: str, precision: str, linears: Quantised) -> None:
        with self._lock:
            self._loads.append(CheckpointLoad(checkpoint, path, precision, linears))

    def take(self) -> list[CheckpointLoad]:
        """The loads added since the last call."""
        with self._lock:
            loads, self._loads = self._loads, []
        return loads
