"""`decidealot evaluate`'s numbers against laya-evals' own (`laya.evals`, laya 0.4.15): the same
answer records, fed to both, give the same `overall` and slices under the same metric names
(ties in confidence included, which laya's coverage cut keeps together), the same question
fingerprint for the same file, and the same baseline verdicts. The command's real answers go
through the same check in tests/e2e/test_evaluate.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from decidealot.contract import Answer, ChoiceAnswer, NoulAnswer, ScoreAnswer
from decidealot.evaluate import gate, metrics, rows

evals = pytest.importorskip("laya.evals")

WITHIN = (0.25, 1.0)


def _probabilities(rng: random.Random, count: int) -> list[float]:
    """Coarse probabilities (tenths, mostly), so many answers tie in confidence."""
    weights = [rng.randint(1, 6) for _ in range(count)]
    total = sum(weights)
    return [w / total for w in weights]


def _question_and_answer(rng: random.Random) -> tuple[dict[str, Any], Answer, Any]:
    kind = rng.choice(["choice", "noul", "score"])
    if kind == "choice":
        labels = rng.sample(["allow", "review", "deny", "escalate", "hold"], rng.randint(2, 4))
        probs = dict(zip(labels, _probabilities(rng, len(labels)), strict=True))
        chosen = max(labels, key=probs.__getitem__)
        question = {"type": "choice", "criteria": {label: label.title() for label in labels}}
        return question, ChoiceAnswer(chosen, rng.random(), probs), rng.choice(labels)
    if kind == "noul":
        noul = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9, rng.random()])
        question = {"type": "noul", "instructions": rng.choice(["Billing?", {"ask": "Urgent?"}])}
        return question, NoulAnswer(noul), rng.random() < 0.5
    levels = rng.randint(2, 5)
    probs = _probabilities(rng, levels)
    score = sum(i * p for i, p in enumerate(probs))
    question = {"type": "score", "criteria": [f"level {i}" for i in range(levels)]}
    keys = [str(i) for i in range(levels)]
    legend = dict(zip(keys, keys, strict=True))
    answer = ScoreAnswer(score, rng.random(), legend, dict(zip(keys, probs, strict=True)))
    expected = rng.randrange(levels) if rng.random() < 0.8 else rng.uniform(0, levels - 1)
    return question, answer, expected


def records(seed: int, count: int) -> list[dict[str, Any]]:
    """Rows in laya-evals' format, each with the answers a model gave (`answers`) and the model
    that gave them."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        questions, answers, expected = {}, {}, {}
        for q in range(rng.randint(1, 3)):
            question, answer, gold = _question_and_answer(rng)
            qid = f"q{q}-{question['type']}"
            questions[qid], answers[qid] = question, answer
            if rng.random() < 0.9:
                expected[qid] = gold
        if not expected:
            expected[next(iter(questions))] = gold
        row: dict[str, Any] = {"state": f"row {i}", "questions": questions, "expected": expected}
        if rng.random() < 0.5:
            row["tags"] = rng.sample(["vip", "new", "eu"], rng.randint(1, 2))
        if rng.random() < 0.5:
            row["language"] = rng.choice(["en", "de"])
        out.append({"row": row, "answers": answers, "model": rng.choice(["m-a", "m-b"])})
    return out


def ours(data: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    chosen = [*metrics.DEFAULT_METRICS, *(metrics.score_within(k) for k in WITHIN)]
    cases = []
    for each in data:
        row = each["row"]
        for qid, expected in row["expected"].items():
            record = metrics.answer_record(each["answers"][qid])
            cases.append(
                metrics.case(
                    qid,
                    record,
                    expected,
                    chosen,
                    model=each["model"],
                    tags=row.get("tags", ()),
                    language=row.get("language"),
                )
            )
    return metrics.aggregate(cases, chosen), metrics.slices(cases, chosen)


class Replay:
    """A laya-evals runner that answers each row with the records the model gave it."""

    def __init__(self, data: list[dict[str, Any]]) -> None:
        self._by_state = {each["row"]["state"]: each for each in data}

    def predict(self, state: str, questions: dict[str, Any]) -> dict[str, Any]:
        each = self._by_state[state]
        answers = {qid: metrics.answer_record(a) for qid, a in each["answers"].items()}
        return {"model": each["model"], "answers": answers}


def theirs(data: list[dict[str, Any]]) -> Any:
    dataset = evals.Dataset([evals.Example.from_dict(each["row"]) for each in data])
    chosen = evals.default_evaluators() + [evals.ScoreWithin(k) for k in WITHIN]
    return evals.evaluate(Replay(data), dataset, evaluators=chosen)


def without_timing(overall: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in overall.items() if not k.endswith("_ms")}


@pytest.mark.parametrize(("seed", "count"), [(1, 5), (2, 40), (3, 400)])
def test_the_same_records_give_laya_evals_numbers(seed: int, count: int) -> None:
    data = records(seed, count)
    overall, slices = ours(data)
    report = theirs(data)
    expected = without_timing(report.overall)
    assert set(overall) == set(expected)
    for name in ("choice_accuracy", "noul_accuracy", "score_mae", "ece", "brier", "aurc"):
        assert name in overall, name
    assert {"selective_accuracy@50", "selective_accuracy@80", "score_within_0.25"} <= set(overall)
    assert overall == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert slices.keys() == report.slices.keys()
    for dimension, groups in report.slices.items():
        assert slices[dimension].keys() == groups.keys(), dimension
        for value, numbers in groups.items():
            assert slices[dimension][value] == pytest.approx(numbers, rel=1e-12, abs=1e-12)


def test_ties_are_cut_as_laya_cuts_them() -> None:
    """Eight answers at one confidence, four right: a cut can only take the whole group, so no
    order of the rows moves `aurc` or `selective_accuracy@50` (laya's definition 2)."""
    rng = random.Random(7)
    base = [(0.8, i % 2 == 0) for i in range(8)] + [(0.95, True), (0.6, False)]
    for _ in range(5):
        rng.shuffle(base)
        confidences = [c for c, _ in base]
        corrects = [y for _, y in base]
        assert metrics.aurc(confidences, corrects) == pytest.approx(
            evals.aurc(confidences, corrects), rel=1e-12
        )
        for coverage in (0.1, 0.5, 0.8, 1.0):
            assert metrics.selective_accuracy(confidences, corrects, coverage) == pytest.approx(
                evals.selective_accuracy(confidences, corrects, coverage), rel=1e-12
            )
        assert metrics.ece(confidences, corrects) == pytest.approx(
            evals.ece(confidences, corrects), rel=1e-12
        )


def test_the_run_identity_is_laya_evals(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(each["row"]) + "\n" for each in records(4, 60)))
    examples = rows.read_rows(path)
    assert rows.questions_sha256(examples) == evals.questions_fingerprint(
        evals.Dataset.from_jsonl(str(path))
    )
    assert rows.file_sha256(path) == evals.file_fingerprint(str(path))


def test_the_baseline_verdicts_are_laya_evals() -> None:
    report = theirs(records(5, 80))
    config = {"schema": gate.SCHEMA, "coverage_metric_definition": 2, "dataset_sha256": "x"}
    overall = without_timing(report.overall)
    shifted = {k: v + 0.01 for k, v in overall.items()}
    cases: list[tuple[dict[str, Any], dict[str, float]]] = [
        ({"config": config, "overall": shifted}, {}),
        ({"config": config, "overall": shifted}, dict.fromkeys(overall, 0.02)),
        ({"config": config, "overall": shifted | {"gone": 1.0}}, dict.fromkeys(overall, 0.02)),
        ({"config": {"dataset_sha256": "x"}, "overall": shifted}, dict.fromkeys(overall, 0.02)),
        (shifted, {"ece": 0.02}),  # a bare metric map
    ]
    for baseline, tolerances in cases:
        mine = gate.compare(config, overall, baseline, tolerances)
        upstream = evals.EvalReport(config=dict(config), overall=overall)
        theirs_ok, theirs_deltas = upstream.compare(baseline, tolerances)
        assert mine[0] == theirs_ok
        assert mine[1].keys() == theirs_deltas.keys()
        for metric, delta in theirs_deltas.items():
            assert mine[1][metric].get("missing") == delta.get("missing")
            assert bool(mine[1][metric].get("incomparable")) == bool(delta.get("incomparable"))
    other = {"config": {"schema": gate.SCHEMA, "dataset_sha256": "y"}, "overall": overall}
    upstream = evals.EvalReport(config=dict(config), overall=overall)
    assert len(gate.incomparable(config, other)) == len(upstream.comparable_to(other)[1]) == 1
