"""Contract answers from one question's option probabilities, for every local provider (each
with its own confidence rule, noul option order and score legend); nothing rounded. Pure Python."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from decidealot.contract import (
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    Json,
    NoulAnswer,
    Question,
    ScoreAnswer,
    ScoreQuestion,
)

ConfidenceRule = Callable[[Sequence[float]], float]  # each provider keeps its upstream's


def softmax(logits: Sequence[float], temperature: float = 1.0) -> list[float]:
    """In float64, the largest logit subtracted, as every upstream readout does."""
    scaled = [float(x) / temperature for x in logits]
    top = max(scaled)
    exps = [math.exp(x - top) for x in scaled]
    total = sum(exps)
    return [e / total for e in exps]


def first_max(values: Sequence[float]) -> int:
    """Index of the largest value, the first one on a tie (as torch and numpy argmax)."""
    return max(range(len(values)), key=values.__getitem__)


def answer_from_probabilities(
    question: Question,
    probs: Sequence[float],
    confidence: ConfidenceRule,
    *,
    true_index: int,
    legend: dict[str, Json] | None = None,
    best: int | None = None,
) -> Answer:
    """One question's answer from `probs` in option order. `true_index`: P(true)'s place among
    a noul's options; `legend` (score): the caller's levels unless given; `best` (choice): the
    most probable option unless given (Von's raw-logit argmax, which a temperature never moves)."""
    probs = list(probs)
    if isinstance(question, ChoiceQuestion):
        labels = list(question.criteria)
        return ChoiceAnswer(
            choice=labels[first_max(probs) if best is None else best],
            confidence=confidence(probs),
            probabilities=dict(zip(labels, probs, strict=True)),
        )
    if isinstance(question, ScoreQuestion):
        if legend is None:
            legend = {str(i): level for i, level in enumerate(question.criteria)}
        return ScoreAnswer(
            score=sum(i * p for i, p in enumerate(probs)),
            confidence=confidence(probs),
            legend=legend,
            probabilities={str(i): p for i, p in enumerate(probs)},
        )
    return NoulAnswer(noul=max(0.0, min(1.0, probs[true_index])))
