"""The CI gate, as laya-evals' (`laya.evals_cli`): limits on metrics, a baseline report with
tolerances, and the refusal to compare two reports that are not the same measurement. A broken
limit or an unreadable baseline is a usage error (`GateError`, exit 2); a limit or tolerance the
run misses is a failure line (exit 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from decidealot.evaluate.metrics import COVERAGE_METRIC_DEFINITION

SCHEMA = "decidealot-evaluate-report/1"
MEASUREMENT = ("schema", "dataset_sha256", "questions_sha256")
"""The identity keys that make two reports one measurement: a key present on both sides with
different values refuses the comparison (a key missing on one side is unknown, as laya's)."""
ANSWERED_BY = ("selector", "answered", "checkpoints")
"""What answered: told beside the deltas when it differs from the baseline's, never refused,
since a baseline exists to compare a changed model (a new checkpoint, calibration, precision)."""


class GateError(ValueError):
    """A limit, tolerance or baseline the gate cannot use; the message names it."""


def pairs(values: Sequence[str] | None, option: str) -> dict[str, float]:
    """`METRIC=VALUE` options as a map; a non-finite value would decide nothing: refused."""
    out: dict[str, float] = {}
    for pair in values or []:
        name, _, raw = pair.partition("=")
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        if not name.strip() or not math.isfinite(number):
            raise GateError(f"{option} {pair!r}: expected METRIC=NUMBER (a finite number)")
        out[name.strip()] = number
    return out


def limit_failures(
    overall: Mapping[str, float], mins: Mapping[str, float], maxs: Mapping[str, float]
) -> list[str]:
    """Each limit against the metric it names; a metric the report lacks fails."""
    failures = []
    for bound, limits, worse in (("minimum", mins, float.__lt__), ("maximum", maxs, float.__gt__)):
        for name, value_limit in limits.items():
            value = overall.get(name)
            if value is None:
                failures.append(f"metric {name!r} is not in the report")
            elif math.isnan(value):
                failures.append(f"metric {name!r} is NaN")
            elif worse(float(value), value_limit):
                side = "below" if bound == "minimum" else "above"
                failures.append(f"{name}={value:.4f} is {side} the {bound} {value_limit:.4f}")
    return failures


def load_report(path: Path) -> dict[str, Any]:
    """A report written by `--json` (this command's or laya-evals'), as an object."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise GateError(f"cannot read baseline {path}: {exc}") from None
    if not isinstance(document, dict):
        raise GateError(f"cannot read baseline {path}: expected a JSON object")
    return document


def _metric_map(values: Any, label: str, allow_empty: bool) -> dict[str, float]:
    if not isinstance(values, dict):
        raise GateError(f"{label} metrics must be an object of metric name to number")
    if not values and not allow_empty:
        raise GateError(f"{label} has no metrics to compare, so nothing in it could fail")
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GateError(f"{label} metric {name!r} is not a number")
    return values


def compare(
    config: Mapping[str, Any],
    overall: Mapping[str, float],
    baseline: Mapping[str, Any],
    tolerances: Mapping[str, float],
) -> tuple[bool, dict[str, dict[str, Any]]]:
    """laya's `EvalReport.compare`: every baseline metric (latencies only when a tolerance names
    them) within its tolerance (0 unless given); a missing or NaN one fails, and so does a
    coverage metric of a report cut by another coverage definition."""
    base = _metric_map(baseline.get("overall", baseline), "baseline", allow_empty=False)
    ours = _metric_map(dict(overall), "report", allow_empty=True)
    deltas: dict[str, dict[str, Any]] = {}
    ok = True
    for metric, base_value in base.items():
        if metric.endswith("_ms") and metric not in tolerances:
            continue
        allowed = float(tolerances.get(metric, 0.0))
        if metric == "aurc" or metric.startswith("selective_accuracy@"):
            conflict = _coverage_conflict(config, baseline)
            if conflict is not None:
                value = float(ours.get(metric, math.nan))
                deltas[metric] = {"baseline": float(base_value), "value": value}
                deltas[metric] |= {"diff": math.nan, "tolerance": allowed}
                deltas[metric]["incomparable"] = conflict
                ok = False
                continue
        if metric not in ours:
            deltas[metric] = {"baseline": float(base_value), "value": math.nan}
            deltas[metric] |= {"diff": math.nan, "tolerance": allowed, "missing": True}
            ok = False
            continue
        diff = ours[metric] - float(base_value)
        deltas[metric] = {
            "baseline": float(base_value),
            "value": ours[metric],
            "diff": diff,
            "tolerance": allowed,
        }
        if not abs(diff) <= allowed:
            ok = False
    return ok, deltas


def _coverage_conflict(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> str | None:
    """Why a coverage metric cannot be compared: a report that says no definition is laya's 1."""
    theirs = baseline.get("config")
    there = theirs.get("coverage_metric_definition") if isinstance(theirs, dict) else None
    here = config.get("coverage_metric_definition")
    if here == there == COVERAGE_METRIC_DEFINITION:
        return None
    return (
        f"the baseline's coverage cut is definition {there or 1}, this run's {here}: "
        "regenerate the baseline before comparing a coverage metric"
    )


def identity_of(document: Mapping[str, Any]) -> dict[str, Any]:
    """A report's identity keys, from its `config` or its top level (as laya reads them)."""
    config = document.get("config")
    found = dict(config) if isinstance(config, dict) else {}
    for key in MEASUREMENT:
        if found.get(key) is None and document.get(key) is not None:
            found[key] = document[key]
    return found


def incomparable(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """Why the baseline is not the same measurement as this run, one reason per key."""
    other = identity_of(baseline)
    return [
        f"{key}: baseline is {other[key]}, this run is {config[key]}"
        for key in MEASUREMENT
        if config.get(key) is not None and other.get(key) is not None and config[key] != other[key]
    ]


def answered_changes(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """What answered differently from the baseline (told, not refused)."""
    other = identity_of(baseline)
    return [
        f"{key}: baseline {json.dumps(other[key])}, this run {json.dumps(config[key])}"
        for key in ANSWERED_BY
        if key in other and key in config and other[key] != config[key]
    ]


def delta_lines(deltas: Mapping[str, Mapping[str, Any]]) -> list[str]:
    out = []
    for metric, delta in sorted(deltas.items()):
        if delta.get("missing"):
            out.append(f"{metric:<22} baseline={delta['baseline']:.4f} missing from the report")
        elif delta.get("incomparable"):
            out.append(
                f"{metric:<22} baseline={delta['baseline']:.4f} value={delta['value']:.4f} "
                f"not compared: {delta['incomparable']}"
            )
        else:
            out.append(
                f"{metric:<22} baseline={delta['baseline']:.4f} value={delta['value']:.4f} "
                f"diff={delta['diff']:+.4f} (tol {delta['tolerance']:.4f})"
            )
    return out
