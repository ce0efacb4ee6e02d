"""The fifth provider's worker side: every noul is the checkpoint's weight, every choice the
first option at that probability. Torch-free; it runs in a real worker process."""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from decidealot.contract import ChoiceQuestion, NoulQuestion
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.protocol import PassShape, ReportLoad
from decidealot.providers.worker.readout import answer_from_probabilities


@dataclass(frozen=True)
class Row:
    tokens: int


@dataclass(frozen=True)
class Prepared:
    job: Job
    group: str
    rows: list[Row]

    @property
    def input_tokens(self) -> int:
        return sum(row.tokens for row in self.rows)


class FifthEngine:
    shape = PassShape()

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def prepare(self, job: Job) -> Prepared:
        for name, question in job.questions.items():
            if not isinstance(question, ChoiceQuestion | NoulQuestion):
                raise RequestInvalid.question(name, "the fifth provider answers choice and noul")
        return Prepared(job, job.checkpoint, [Row(8) for _ in job.questions])

    def forward(self, group: Hashable, rows: Sequence[Row]) -> list[int]:
        return [os.getpid()] * len(rows)

    def finish(self, prepared: Prepared, outputs: Sequence[object]) -> Decision:
        answers = {}
        for name, question in prepared.job.questions.items():
            if isinstance(question, NoulQuestion):
                probs = [self.weight, 1 - self.weight]
            else:
                rest = (1 - self.weight) / max(len(question.criteria) - 1, 1)
                probs = [self.weight] + [rest] * (len(question.criteria) - 1)
            answers[name] = answer_from_probabilities(question, probs, max, true_index=0)
        return Decision("fifth-1", answers, prepared.input_tokens)


def create(spec: EngineSpec, report: ReportLoad) -> FifthEngine:
    weights = json.loads((Path(spec.checkpoints["fifth-1"]) / "weights.json").read_text())
    return FifthEngine(float(weights["weight"]))
