"""`decidealot evaluate`'s parts without a model: rows of both formats and the `file:line` of a
bad one, the threshold tables against a hand computation, the gate's limits and baseline rules,
and the command's usage errors (exit 2) before anything runs. Parity with laya-evals' metrics:
tests/parity/test_evaluate_parity.py; the command against real servers: tests/e2e/test_evaluate.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from decidealot import cli
from decidealot.contract import ChoiceAnswer, NoulAnswer, ScoreAnswer, answer_confidence
from decidealot.evaluate import gate, metrics, rows, thresholds

CHOICE = {"type": "choice", "criteria": {"allow": "Fine.", "review": "Check it.", "deny": "No."}}
SCORE = {"type": "score", "criteria": ["low", "mid", "high"]}
NOUL = {"type": "noul", "instructions": "Is it billing?"}


def write(path: Path, lines: list[Any]) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


# -- rows ---------------------------------------------------------------------------------------


def test_both_formats_are_read_with_their_lines(tmp_path: Path) -> None:
    data = write(
        tmp_path / "data.jsonl",
        [
            {
                "state": "a",
                "questions": {"route": CHOICE, "level": SCORE, "bill": NOUL},
                "expected": {"route": "review", "level": 2},
                "tags": ["vip"],
                "language": "en",
            },
            "",
            "# a comment",
            {"state": {"x": 1}, "question": NOUL, "gold": "yes"},
            {"state": "b", "instructions": "Pick.", "choices": ["a", "b"], "gold": "b"},
            {"state": ["c"], "question": SCORE, "gold": "1"},
        ],
    )
    found = rows.read_rows(data)
    assert [each.line for each in found] == [1, 4, 5, 6]
    assert found[0].expected == {"route": "review", "level": 2}
    assert set(found[0].questions) == {"route", "level", "bill"}  # asked, not all scored
    assert found[0].tags == ("vip",) and found[0].language == "en"
    assert found[1].questions == {"noul": NOUL} and found[1].expected == {"noul": True}
    assert found[2].expected == {"choice": "b"}
    assert found[2].questions["choice"]["criteria"] == {"a": "a", "b": "b"}
    assert found[3].expected == {"score": 1}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "a row must be a JSON object"),
        ({"state": "x"}, "needs 'questions' and 'expected'"),
        ({"state": "x", "questions": {"q": NOUL}}, "needs 'expected'"),
        ({"state": "x", "questions": {"q": NOUL}, "expected": {"p": True}}, "unknown question"),
        ({"state": "x", "questions": {"q": CHOICE}, "expected": {"q": "maybe"}}, "expected.q:"),
        ({"state": "x", "questions": {"q": NOUL}, "expected": {"q": "yes"}}, "true or false"),
        ({"state": "x", "questions": {"q": SCORE}, "expected": {"q": 3}}, "number in 0..2"),
        ({"state": "x", "questions": {"q": SCORE}, "expected": {"q": True}}, "number in 0..2"),
        (
            {"state": "x", "questions": {"q": {"type": "choice"}}, "expected": {"q": "a"}},
            "questions.q.choice.criteria: Field required",
        ),
        ({"state": 3, "questions": {"q": NOUL}, "expected": {"q": True}}, "state must be"),
        ({"state": "x", "question": NOUL, "gold": "perhaps"}, "noul gold"),
    ],
)
def test_a_bad_row_names_its_file_and_line(tmp_path: Path, row: Any, message: str) -> None:
    good = {"state": "x", "questions": {"q": NOUL}, "expected": {"q": True}}
    data = write(tmp_path / "data.jsonl", [good, "# skipped", row])
    with pytest.raises(rows.RowError) as caught:
        rows.read_rows(data)
    assert str(caught.value).startswith(f"{data}:3: ")
    assert message in str(caught.value)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(rows.RowError, match="no rows"):
        rows.read_rows(write(tmp_path / "empty.jsonl", ["", "# nothing"]))


# -- thresholds, by hand ------------------------------------------------------------------------

ROUTE = [  # (probability of the choice reported, right?)
    (0.95, True),
    (0.95, False),
    (0.90, True),
    (0.80, True),
    (0.70, False),
    (0.60, True),
    (0.55, True),
    (0.40, False),
]


def route_cases() -> list[metrics.Case]:
    out = []
    for p, right in ROUTE:
        rest = (1 - p) / 2
        answer = ChoiceAnswer("allow", 0.0, {"allow": p, "review": rest, "deny": rest})
        expected = "allow" if right else "deny"
        out.append(
            metrics.case("route", metrics.answer_record(answer), expected, metrics.DEFAULT_METRICS)
        )
    return out


def test_the_table_is_the_hand_computation() -> None:
    found = thresholds.table(route_cases(), max_error=0.3)
    assert found["type"] == "choice" and found["answers"] == 8
    by_threshold = {row["threshold"]: row for row in found["table"]}
    # threshold: (accepted, right) counted by hand from ROUTE
    hand = {0.0: (8, 5), 0.5: (7, 5), 0.6: (6, 4), 0.7: (5, 3), 0.8: (4, 3)}
    hand |= {0.85: (3, 2), 0.9: (3, 2), 0.95: (2, 1), 0.975: (0, 0), 0.99: (0, 0)}
    for threshold, (accepted, right) in hand.items():
        row = by_threshold[threshold]
        assert row["accepted"] == accepted
        assert row["coverage"] == pytest.approx(accepted / 8)
        if accepted:
            assert row["accuracy"] == pytest.approx(right / accepted)
            assert row["error"] == pytest.approx((accepted - right) / accepted)
        else:
            assert row["accuracy"] is None and row["error"] is None
    # one point per distinct confidence, the tie at 0.95 together
    assert [(p["threshold"], p["accepted"]) for p in found["curve"]] == [
        (0.95, 2), (0.9, 3), (0.8, 4), (0.7, 5), (0.6, 6), (0.55, 7), (0.4, 8)
    ]  # fmt: skip
    # error at or under 0.3: 0.40 keeps 3/8 wrong, 0.55 keeps 2/7: the lowest that holds
    assert found["pick"]["threshold"] == 0.55
    assert found["pick"]["coverage"] == pytest.approx(7 / 8)
    assert found["pick"]["error"] == pytest.approx(2 / 7)
    assert thresholds.table(route_cases(), 0.25)["pick"]["threshold"] == 0.8  # 1 of 4 wrong
    assert thresholds.table(route_cases(), 0.1)["pick"] is None
    assert thresholds.table(route_cases(), None)["pick"] is None


def test_a_score_is_judged_by_its_expected_level() -> None:
    def score(value: float, expected: Any) -> metrics.Case:
        answer = ScoreAnswer(value, 0.5, {}, {"0": 0.1, "1": 0.6, "2": 0.3})
        return metrics.case("level", metrics.answer_record(answer), expected, [])

    cases = [score(1.4, 1), score(0.5, 0), score(1.9, 2), score(1.0, 1.5)]
    assert [c["answer"]["level"] for c in cases] == [1, 1, 2, 1]  # a half rounds up
    assert [thresholds.judged(c) for c in cases] == [True, False, True, None]
    found = thresholds.table(cases, None)
    assert found["answers"] == 3
    assert [(p["threshold"], p["accepted"]) for p in found["curve"]] == [(0.6, 2), (0.3, 3)]


def test_the_confidence_is_the_reported_answers_probability() -> None:
    assert answer_confidence(NoulAnswer(0.2)) == pytest.approx(0.8)
    assert answer_confidence(NoulAnswer(0.7)) == pytest.approx(0.7)
    assert answer_confidence(ChoiceAnswer("b", 0.9, {"a": 0.7, "b": 0.3})) == 0.3
    assert answer_confidence(ScoreAnswer(1.6, 0.9, {}, {"0": 0.1, "1": 0.2, "2": 0.7})) == 0.7


# -- the gate -----------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", ["ece", "ece=", "=0.1", "ece=inf", "ece=nan", "ece=high"])
def test_a_limit_that_decides_nothing_is_refused(pair: str) -> None:
    with pytest.raises(gate.GateError, match="--max"):
        gate.pairs([pair], "--max")


def test_limits() -> None:
    overall = {"choice_accuracy": 0.7, "ece": 0.2}
    assert gate.limit_failures(overall, {"choice_accuracy": 0.7}, {"ece": 0.2}) == []
    assert gate.limit_failures(overall, {"choice_accuracy": 0.8}, {"ece": 0.1, "aurc": 0.5}) == [
        "choice_accuracy=0.7000 is below the minimum 0.8000",
        "ece=0.2000 is above the maximum 0.1000",
        "metric 'aurc' is not in the report",
    ]


def test_the_baseline_rules() -> None:
    ours = {"schema": gate.SCHEMA, "dataset_sha256": "a", "coverage_metric_definition": 2}
    base = {
        "config": {"schema": gate.SCHEMA, "dataset_sha256": "a", "coverage_metric_definition": 2},
        "overall": {"choice_accuracy": 0.8, "aurc": 0.2, "ece": 0.1, "latency_p50_ms": 9.0},
    }
    overall = {"choice_accuracy": 0.79, "aurc": 0.2, "latency_p50_ms": 99.0}
    ok, deltas = gate.compare(ours, overall, base, {"choice_accuracy": 0.02})
    assert not ok and deltas["ece"]["missing"]  # a metric the run lost fails
    assert "latency_p50_ms" not in deltas  # timing is told only when a tolerance names it
    assert deltas["choice_accuracy"]["diff"] == pytest.approx(-0.01)
    ok, deltas = gate.compare(ours, overall | {"ece": 0.1}, base, {"choice_accuracy": 0.02})
    assert ok
    stale = base | {"config": {"dataset_sha256": "a"}}  # laya's coverage definition 1
    ok, deltas = gate.compare(ours, overall | {"ece": 0.1}, stale, {"choice_accuracy": 0.02})
    assert not ok and "definition 1" in deltas["aurc"]["incomparable"]
    assert gate.incomparable(ours, base) == []
    assert gate.incomparable(ours | {"dataset_sha256": "b"}, base) == [
        "dataset_sha256: baseline is a, this run is b"
    ]
    assert gate.incomparable(ours, {"overall": {}}) == []  # unknown is not a conflict
    with pytest.raises(gate.GateError, match="no metrics"):
        gate.compare(ours, overall, {"overall": {}}, {})
    with pytest.raises(gate.GateError, match="not a number"):
        gate.compare(ours, overall, {"overall": {"ece": "low"}}, {})


# -- the command's usage errors: exit 2 before any model runs ------------------------------------


def test_a_bad_row_exits_2_naming_the_line(
    environ: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"state": "x", "questions": {"q": CHOICE}, "expected": {"q": "allow"}}
    bad = {"state": "x", "questions": {"q": CHOICE}, "expected": {"q": "maybe"}}
    data = write(tmp_path / "data.jsonl", [good, good, bad])
    assert cli.main(["evaluate", str(data), "--model", "laya"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"decidealot evaluate: {data}:3: expected.q: 'maybe' is not one of")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tolerance", "ece=0.1"], "--tolerance: only with --baseline"),
        (["--max", "ece=inf"], "--max 'ece=inf'"),
        (["--batch-size", "0"], "--batch-size"),
        (["--max-error", "1.5"], "--max-error"),
        (["--score-within", "-1"], "--score-within"),
        (["--key-file", "k"], "--key-file: only with --url"),
        (["--baseline", "/nonexistent/base.json"], "cannot read baseline"),
    ],
)
def test_a_bad_option_exits_2(
    environ: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    message: str,
) -> None:
    data = write(tmp_path / "data.jsonl", [{"state": "x", "question": NOUL, "gold": True}])
    assert cli.main(["evaluate", str(data), "--model", "laya", *options]) == 2
    assert message in capsys.readouterr().err


def test_a_key_in_the_url_is_refused(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["evaluate", "d.jsonl", "--model", "laya", "--url", "http://k:s@127.0.0.1:1"])
    assert exited.value.code == 2
    assert "put the key in DECIDEALOT_API_KEY" in capsys.readouterr().err
