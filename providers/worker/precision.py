"""The precision an engine computes in, from `EngineSpec.options["precision"]`
(`DECIDEALOT_PRECISION`), checked against the device the worker resolved."""

from __future__ import annotations

from collections.abc import Mapping

from decidealot.config import precision_problem
from decidealot.contract import Json


def engine_precision(options: Mapping[str, Json], device: str) -> str:
    """fp32 when unset; refused (naming the setting) when `device` cannot run it, e.g. int8
    once `DECIDEALOT_DEVICE=auto` resolved to cuda."""
    precision = options.get("precision", "fp32")
    problem = precision_problem(str(precision), device)
    if problem is not None:
        raise ValueError(f"DECIDEALOT_PRECISION: {problem}")
    return str(precision)
