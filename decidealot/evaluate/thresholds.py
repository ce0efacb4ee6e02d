"""The threshold the contract asks a caller to choose, per question: acting automatically on the
answers whose reported probability is at least t, what share is covered and how often it is
wrong, and for a tolerated error E the lowest t that keeps it (the most coverage it allows).

Choice and noul answers are right as laya-evals judges them; a score answer by its expected
level: the rubric level nearest the expected score is its answer, and it is right when that is
the labelled level (a fractional label is left out of the table). Each answer's confidence is
`contract.answer_confidence`. A threshold accepts every answer at its own confidence, so the
curve has one point per distinct confidence, as laya-evals' coverage metrics cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from decidealot.evaluate.metrics import Case, levels

GRID = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99)
"""The thresholds every table shows; the curve holds every distinct confidence besides."""


def judged(each: Case) -> bool | None:
    """Whether a case's answer is right, for the tables; None when it cannot be judged."""
    if each["correct"] is not None:
        return bool(each["correct"])
    answer, expected = each["answer"], each["expected"]
    if answer.get("type") != "score" or isinstance(expected, bool):
        return None
    if not isinstance(expected, int | float) or expected != int(expected):
        return None
    return answer.get("level") == int(expected)


def point(threshold: float, accepted: int, hits: int, total: int) -> dict[str, Any]:
    """One row of a table: what acting on answers at or above `threshold` gives."""
    return {
        "threshold": threshold,
        "accepted": accepted,
        "coverage": accepted / total,
        "accuracy": hits / accepted if accepted else None,
        "error": (accepted - hits) / accepted if accepted else None,
    }


def table(cases: Sequence[Case], max_error: float | None) -> dict[str, Any]:
    """One question's curve, its grid rows and, for `max_error`, the threshold to use."""
    pairs = [(c["confidence"], right) for c in cases if (right := judged(c)) is not None]
    types = sorted({c["answer"].get("type") for c in cases})
    found: dict[str, Any] = {"type": "/".join(types), "answers": len(pairs)}
    if not pairs:
        return found | {"curve": [], "table": [], "max_error": max_error, "pick": None}
    total = len(pairs)
    curve = [
        point(level.confidence, level.accepted, level.hits, total)
        for level in levels([c for c, _ in pairs], [y for _, y in pairs])
    ]
    rows = []
    for threshold in GRID:
        kept = [right for confidence, right in pairs if confidence >= threshold]
        rows.append(point(threshold, len(kept), sum(kept), total))
    pick = None
    if max_error is not None:
        pick = next((p for p in reversed(curve) if p["error"] <= max_error), None)
    return found | {"curve": curve, "table": rows, "max_error": max_error, "pick": pick}


def tables(cases: Sequence[Case], max_error: float | None) -> dict[str, dict[str, Any]]:
    """`table` per question id, in the order the questions first appear."""
    by_question: dict[str, list[Case]] = {}
    for each in cases:
        by_question.setdefault(each["qid"], []).append(each)
    return {qid: table(group, max_error) for qid, group in by_question.items()}


def lines(found: dict[str, dict[str, Any]]) -> list[str]:
    """The tables as text for the terminal."""
    out = []
    for qid, each in found.items():
        out.append(f"{qid} ({each['type']}, {each['answers']} judged answers):")
        out.append(f"  {'threshold':>9} {'coverage':>9} {'accuracy':>9} {'error':>7}")
        for row in each["table"]:
            if row["accepted"]:
                out.append(
                    f"  {row['threshold']:>9.3f} {row['coverage']:>9.3f} "
                    f"{row['accuracy']:>9.3f} {row['error']:>7.3f}"
                )
            else:
                out.append(f"  {row['threshold']:>9.3f} {0.0:>9.3f} {'-':>9} {'-':>7}")
        if each["max_error"] is not None:
            pick = each["pick"]
            if pick is None:
                out.append(f"  no threshold keeps the error at or under {each['max_error']:g}")
            else:
                out.append(
                    f"  act at >= {pick['threshold']:.4f}: error {pick['error']:.3f} "
                    f"<= {each['max_error']:g}, coverage {pick['coverage']:.3f}"
                )
    return out


def plot_series(found: dict[str, dict[str, Any]]) -> list[tuple[str, list[float], list[float]]]:
    """Risk-coverage curves (coverage, error) per question, for `providers.plots.line_plot`."""
    return [
        (qid, [p["coverage"] for p in each["curve"]], [p["error"] for p in each["curve"]])
        for qid, each in found.items()
        if each["curve"]
    ]
