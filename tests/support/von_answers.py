"""Von answers against von-sdk's: the comparison the parity tests share."""

from __future__ import annotations

from typing import Any

from decidealot.contract import ChoiceAnswer, NoulAnswer, ScoreAnswer

TOLERANCE = 1e-4
"""How far an unrounded probability of ours may lie from von-sdk's."""


def _rounds_to(value: float, reported: float, ndigits: int) -> bool:
    """Whether some u with |u - value| <= TOLERANCE rounds to `reported` (round is monotone)."""
    low, high = round(value - TOLERANCE, ndigits), round(value + TOLERANCE, ndigits)
    return low - 1e-12 <= reported <= high + 1e-12


def _assert_close(unrounded: dict[str, float], theirs: dict[str, float]) -> None:
    assert list(unrounded) == list(theirs)
    for key, value in theirs.items():
        assert _rounds_to(unrounded[key], value, 4), (key, unrounded[key], value)


def assert_same(ours: dict[str, Any], unrounded: dict[str, Any], theirs: Any) -> None:
    assert list(ours) == list(theirs.answers)
    for name, expected in theirs.answers.items():
        got, raw = ours[name], unrounded[name]
        if expected.type == "choice":
            assert isinstance(got, ChoiceAnswer)
            assert got.choice == expected.choice, name
            assert _rounds_to(raw.confidence, expected.confidence, 3), name
            _assert_close(raw.probabilities, expected.probabilities)
        elif expected.type == "score":
            assert isinstance(got, ScoreAnswer)
            assert _rounds_to(raw.score, expected.score, 2), (name, raw.score, expected.score)
            assert _rounds_to(raw.confidence, expected.confidence, 3), name
            assert list(got.legend) == list(expected.legend)
            _assert_close(raw.probabilities, expected.probabilities)
        else:
            assert isinstance(got, NoulAnswer)
            assert _rounds_to(raw.noul, expected.noul_raw, 4), (name, raw.noul, expected.noul_raw)
