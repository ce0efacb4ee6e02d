"""laya-evals' metrics (laya 0.4.15, `laya.evals`), by its definitions, names and tie rule, in
plain Python (the gateway side imports no numpy); tests/parity/test_evaluate_parity.py holds
them to `laya.evals` on identical answer records.

Each answer is scored as one case. Per-answer metrics are means over the cases they apply to:
`choice_accuracy`, `noul_accuracy` (true when noul >= 0.5), `score_mae`, `score_within_<k>`,
`mean_confidence`. The calibration metrics (`ece` over 15 equal-width bins, `brier`, `aurc`,
`selective_accuracy@50` and `@80`) read (confidence, correct) of choice and noul answers, where
the confidence is the probability of the answer reported (`contract.answer_confidence`, what
laya-evals reads when an answer carries `answer_confidence`). A coverage cut is a confidence
threshold, so it never splits a group of equal confidences (laya's coverage definition 2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from decidealot.contract import Answer, Json, ScoreAnswer, answer_confidence, reported_level

ECE_BINS = 15
SELECTIVE_COVERAGES = (0.5, 0.8)
COVERAGE_METRIC_DEFINITION = 2  # laya's: a cut is a confidence threshold, ties kept together
SLICES = ("language", "model", "qid", "tag")

Case = dict[str, Any]
"""One scored answer, in laya-evals' case shape: qid, language, model, tags, expected, answer
(its JSON, `answer_confidence` added), confidence, correct, scores (metric name -> value)."""


@dataclass(frozen=True)
class Metric:
    """A per-answer metric: a number for an answer and its expected value, or None."""

    name: str
    score: Callable[[dict[str, Json], Json], float | None]


def _is_number(value: Json) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _choice_accuracy(answer: dict[str, Json], expected: Json) -> float | None:
    if answer.get("type") != "choice" or not isinstance(expected, str):
        return None
    return 1.0 if answer.get("choice") == expected else 0.0


def _noul_accuracy(answer: dict[str, Json], expected: Json) -> float | None:
    if answer.get("type") != "noul" or not isinstance(expected, bool):
        return None
    return 1.0 if (answer.get("noul", 0.0) >= 0.5) == expected else 0.0


def _score_mae(answer: dict[str, Json], expected: Json) -> float | None:
    if answer.get("type") != "score" or not _is_number(expected):
        return None
    return abs(float(answer.get("score", 0.0)) - float(expected))


def score_within(tolerance: float) -> Metric:
    """`score_within_<k>`: the share of score answers within `tolerance` of the label."""

    def within(answer: dict[str, Json], expected: Json) -> float | None:
        if answer.get("type") != "score" or not _is_number(expected):
            return None
        return 1.0 if abs(float(answer.get("score", 0.0)) - float(expected)) <= tolerance else 0.0

    return Metric(f"score_within_{tolerance:g}", within)


DEFAULT_METRICS = (
    Metric("choice_accuracy", _choice_accuracy),
    Metric("noul_accuracy", _noul_accuracy),
    Metric("score_mae", _score_mae),
    Metric("mean_confidence", lambda answer, expected: answer.get("answer_confidence")),
)


def answer_record(answer: Answer) -> dict[str, Json]:
    """An answer's JSON with what laya-evals and the tables read: `answer_confidence` (the
    probability of the answer reported) and, for a score, `level` (the nearest rubric level)."""
    record = msgspec.to_builtins(answer) | {"answer_confidence": answer_confidence(answer)}
    if isinstance(answer, ScoreAnswer):
        record["level"] = reported_level(answer)
    return record


def correct(answer: dict[str, Json], expected: Json) -> bool | None:
    """Whether a choice or noul answer is right; None for a score (it has no right or wrong)."""
    if answer.get("type") == "choice" and isinstance(expected, str):
        return answer.get("choice") == expected
    if answer.get("type") == "noul" and isinstance(expected, bool):
        return (answer.get("noul", 0.0) >= 0.5) == expected
    return None


def case(
    qid: str,
    answer: dict[str, Json],
    expected: Json,
    metrics: Sequence[Metric],
    *,
    model: str | None = None,
    tags: Sequence[str] = (),
    language: str | None = None,
) -> Case:
    """`answer` (its JSON with `answer_confidence`) scored against `expected`."""
    return {
        "qid": qid,
        "language": language,
        "model": model,
        "tags": list(tags),
        "expected": expected,
        "answer": answer,
        "confidence": answer.get("answer_confidence"),
        "correct": correct(answer, expected),
        "scores": {metric.name: metric.score(answer, expected) for metric in metrics},
    }


# -- the calibration and selective metrics -------------------------------------------------------


def ece(confidences: Sequence[float], corrects: Sequence[bool], bins: int = ECE_BINS) -> float:
    """Expected calibration error over `bins` equal-width bins: the first bin closed at both
    ends, the others open below (laya's `common.ece_score`)."""
    n = len(confidences)
    edges = [i * (1.0 / bins) for i in range(bins)] + [1.0]  # numpy's linspace(0, 1, bins + 1)
    total = 0.0
    for i in range(bins):
        low, high = edges[i], edges[i + 1]
        members = [
            (c, y)
            for c, y in zip(confidences, corrects, strict=True)
            if (c >= low if i == 0 else c > low) and c <= high
        ]
        if members:
            mean_confidence = math.fsum(c for c, _ in members) / len(members)
            accuracy = sum(1 for _, y in members if y) / len(members)
            total += len(members) / n * abs(mean_confidence - accuracy)
    return total


def brier_of_confidence(confidences: Sequence[float], corrects: Sequence[bool]) -> float:
    """Brier score of confidence as P(correct): mean((confidence - correct)^2)."""
    pairs = zip(confidences, corrects, strict=True)
    return math.fsum((c - float(y)) ** 2 for c, y in pairs) / len(confidences)


@dataclass(frozen=True)
class Level:
    """A threshold at one distinct confidence: the answers it accepts, and the right ones."""

    confidence: float
    accepted: int
    hits: int


def levels(confidences: Sequence[float], corrects: Sequence[bool]) -> list[Level]:
    """One `Level` per distinct confidence, most confident first (laya's `_levels`)."""
    order = sorted(zip(confidences, corrects, strict=True), key=lambda pair: -pair[0])
    found: list[Level] = []
    hits = 0
    for index, (confidence, right) in enumerate(order):
        hits += bool(right)
        if index + 1 == len(order) or order[index + 1][0] != confidence:
            found.append(Level(confidence, index + 1, hits))
    return found


def aurc(confidences: Sequence[float], corrects: Sequence[bool]) -> float:
    """Area under the risk-coverage curve: each level's risk weighted by the answers it adds."""
    n = len(confidences)
    area, before = [], 0
    for level in levels(confidences, corrects):
        area.append((1.0 - level.hits / level.accepted) * (level.accepted - before))
        before = level.accepted
    return math.fsum(area) / n


def selective_accuracy(
    confidences: Sequence[float], corrects: Sequence[bool], coverage: float
) -> float:
    """Accuracy over the most confident `coverage` share, the cut extended through its tie
    group (so the share covered can be more than asked)."""
    k = max(1, math.ceil(coverage * len(confidences)))
    for level in levels(confidences, corrects):
        if level.accepted >= k:
            return level.hits / level.accepted
    raise AssertionError("the last level accepts every answer")


# -- a report's overall and slices ---------------------------------------------------------------


def aggregate(cases: Sequence[Case], metrics: Sequence[Metric]) -> dict[str, float]:
    """laya-evals' `overall` for `cases`: each metric that applied to any, then the paired ones."""
    out: dict[str, float] = {}
    for metric in metrics:
        values = [c["scores"][metric.name] for c in cases if c["scores"][metric.name] is not None]
        if values:
            out[metric.name] = float(statistics.fmean(values))
    paired = [
        (c["confidence"], c["correct"])
        for c in cases
        if c["confidence"] is not None and c["correct"] is not None
    ]
    if paired:
        confidences = [c for c, _ in paired]
        corrects = [y for _, y in paired]
        out["ece"] = ece(confidences, corrects)
        out["brier"] = brier_of_confidence(confidences, corrects)
        out["aurc"] = aurc(confidences, corrects)
        for coverage in SELECTIVE_COVERAGES:
            name = f"selective_accuracy@{round(coverage * 100)}"
            out[name] = selective_accuracy(confidences, corrects, coverage)
    return out


def slices(cases: Sequence[Case], metrics: Sequence[Metric]) -> dict[str, dict[str, Any]]:
    """`aggregate` per language, model, question id and tag, for the dimensions cases carry."""
    out: dict[str, dict[str, Any]] = {}
    for dimension in SLICES:
        groups: dict[str, list[Case]] = {}
        for each in cases:
            values: Iterable[Any]
            if dimension == "tag":
                values = each["tags"]
            else:
                values = [] if each[dimension] is None else [each[dimension]]
            for value in values:
                groups.setdefault(str(value), []).append(each)
        if groups:
            out[dimension] = {value: aggregate(group, metrics) for value, group in groups.items()}
    return out


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """(median, nearest-rank 95th), as laya-evals reports latency."""
    ordered = sorted(values)
    rank = (95 * len(ordered) + 99) // 100
    return float(statistics.median(ordered)), float(ordered[rank - 1])
