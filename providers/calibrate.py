"""`decidealot calibrate`'s shared part: label rows through a worker engine, the report, the plot.

Each provider's calibrator (`ProviderDescriptor.calibrator`) fits by its upstream's method
(docs/models.md, "Fitting one"); every used row is scored by a fold's fit that did not see it.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Generic, TypeVar

from decidealot.contract import ChoiceAnswer, Labelled, NoulAnswer, ScoreAnswer
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.planner import run_together
from decidealot.providers.engine.proc import build_engine
from decidealot.providers.engine.protocol import Engine, PreparedJob, ignore_load
from decidealot.providers.plots import line_plot

CHUNK_ROWS = 64  # label rows run together, and how often progress is told
ECE_BINS = 15  # equal-width confidence bins of the calibration error (laya's `ece_score`)

R = TypeVar("R")


@dataclass(frozen=True)
class Setup:  # what the command hands a provider's calibrator
    checkpoint: Path
    key: str  # in the provider's engine
    current: Path | None  # the calibration file the service runs it with; None: its own
    labels: Sequence[Labelled]
    labels_path: Path
    device: str
    precision: str
    torch_threads: int
    folds: int = 5
    seed: int = 0
    progress: Callable[[int, int], None] = lambda done, total: None


@dataclass
class LabelRow(Generic[R]):
    """A used label row: what the service answers now (contract order), what the provider fits."""

    label: Labelled
    before: list[float]
    record: R


@dataclass
class Outcome:
    """A fit: the file to write, what it says, and every used row's held-out probabilities."""

    body: dict[str, Any]
    summary: list[str]
    rows: int
    skipped: list[tuple[int, str]]  # (line, why) for every row the model cannot take
    before: list[list[float]] = field(default_factory=list)
    after: list[list[float]] = field(default_factory=list)
    gold: list[int] = field(default_factory=list)
    """Per used row, in contract order: probabilities now, cross-fitted ones, the answer."""

    def held_out(self, rows: Sequence[LabelRow[Any]], after: Mapping[int, list[float]]) -> None:
        self.before = [row.before for row in rows]
        self.after = [after[i] for i in range(len(rows))]
        self.gold = [row.label.gold for row in rows]


def build(setup: Setup, factory: str) -> Engine:
    """The engine on `setup`'s checkpoint as a worker builds it, with the service's calibration."""
    calibrations = {setup.key: str(setup.current)} if setup.current is not None else {}
    spec = EngineSpec(
        factory=factory,
        checkpoints={setup.key: str(setup.checkpoint)},
        preload=[setup.key],
        device=setup.device,
        torch_threads=setup.torch_threads,
        options={"precision": setup.precision, "calibrations": calibrations},
    )
    return build_engine(spec, ignore_load)


QUESTION = "q"  # the one question of a label row's job


def collect(
    engine: Engine, read: Callable[[PreparedJob, Sequence[object]], R], setup: Setup
) -> tuple[list[LabelRow[R]], list[tuple[int, str]]]:
    """Every label row through `engine`; one it refuses (`RequestInvalid`) is skipped, with why."""

    def finish(prepared: PreparedJob, outputs: Sequence[object]) -> tuple[Decision, R]:
        return engine.finish(prepared, outputs), read(prepared, outputs)

    reading = SimpleNamespace(shape=engine.shape, forward=engine.forward, finish=finish)
    used: list[LabelRow[R]] = []
    skipped: list[tuple[int, str]] = []
    total = len(setup.labels)
    for start in range(0, total, CHUNK_ROWS):
        prepared, kept = [], []
        for label in setup.labels[start : start + CHUNK_ROWS]:
            job = Job(setup.key, label.state, {QUESTION: label.question})
            try:
                prepared.append(engine.prepare(job))
            except RequestInvalid as exc:
                skipped.append((label.line, "; ".join(i.msg for i in exc.issues)))
            else:
                kept.append(label)
        finished: list[Any] = run_together(reading, prepared)  # type: ignore[arg-type]
        for label, (decision, record) in zip(kept, finished, strict=True):
            used.append(LabelRow(label, answer_probabilities(decision, QUESTION), record))
        setup.progress(min(start + CHUNK_ROWS, total), total)
    if not used:
        raise ValueError(f"no row of {setup.labels_path} could be used: {skipped[0][1]}")
    return used, skipped


def answer_probabilities(decision: Decision, name: str) -> list[float]:
    """One answer's probabilities in contract order (a noul's as [false, true])."""
    answer = decision.answers[name]
    if isinstance(answer, NoulAnswer):
        return [1.0 - answer.noul, answer.noul]
    assert isinstance(answer, ChoiceAnswer | ScoreAnswer)
    return list(answer.probabilities.values())


def folds_of(count: int, folds: int, seed: int) -> tuple[list[int], list[list[int]]]:
    """von-sdk's split: the rows' shuffled order, and fold f's held-out rows (every `folds`-th)."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    folds = max(2, min(folds, count))
    return order, [sorted(order[f::folds]) for f in range(folds)]


# -- the report ---------------------------------------------------------------------------------


def log_loss(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    return sum(-math.log(max(p[g], 1e-15)) for p, g in zip(probs, gold, strict=True)) / len(gold)


def brier(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """Multi-class Brier score: squared distance to the one-hot answer, summed over options."""
    rows = zip(probs, gold, strict=True)
    return sum(sum((q - (i == g)) ** 2 for i, q in enumerate(p)) for p, g in rows) / len(gold)


def reliability(
    probs: Sequence[Sequence[float]], gold: Sequence[int], bins: int = ECE_BINS
) -> list[tuple[int, float, float]]:
    """(rows, mean confidence, accuracy) per bin of top-label confidence, as laya's `ece_score`."""
    table: list[list[float]] = [[0, 0.0, 0.0] for _ in range(bins)]
    for p, g in zip(probs, gold, strict=True):
        top = max(range(len(p)), key=p.__getitem__)
        conf = p[top]
        b = min(bins - 1, max(0, math.ceil(conf * bins) - 1))
        table[b][0] += 1
        table[b][1] += conf
        table[b][2] += top == g
    return [(int(n), c / n, a / n) if n else (0, 0.0, 0.0) for n, c, a in table]


def expected_calibration_error(
    probs: Sequence[Sequence[float]], gold: Sequence[int], bins: int = ECE_BINS
) -> float:
    return sum(n * abs(c - a) for n, c, a in reliability(probs, gold, bins)) / len(gold)


def report(outcome: Outcome, out: Path) -> list[str]:
    lines = [f"rows used: {outcome.rows}", f"rows skipped: {len(outcome.skipped)}"]
    lines += [f"  line {line}: {why}" for line, why in outcome.skipped]
    lines += outcome.summary
    if outcome.gold:
        held = len(outcome.gold)
        lines.append(f"on held-out rows ({held}, each scored by a fit that did not see it):")
        lines.append(f"  {'':12}{'before':>10}{'after':>10}")
        for name, metric in (
            ("log-loss", log_loss),
            ("Brier", brier),
            ("ECE", expected_calibration_error),
        ):
            before = metric(outcome.before, outcome.gold)
            after = metric(outcome.after, outcome.gold)
            lines.append(f"  {name:12}{before:10.4f}{after:10.4f}")
    lines.append(f"wrote {out}")
    return lines


def write_fitted(path: Path, body: dict[str, Any]) -> None:
    """The file as indented JSON, replaced atomically (a reader never sees half of it)."""
    destination = Path(os.path.realpath(path))
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=destination.parent, prefix=".calibration.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            json.dump(body, stream, indent=2)
            stream.write("\n")
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def plot(path: Path, outcome: Outcome) -> None:
    """A reliability diagram of the held-out rows, before and after, as a PNG."""
    series = []
    for name, probs in (("before", outcome.before), ("after", outcome.after)):
        bins = [(c, a) for n, c, a in reliability(probs, outcome.gold) if n]
        ece = expected_calibration_error(probs, outcome.gold)
        series.append((f"{name} (ECE {ece:.3f})", [c for c, _ in bins], [a for _, a in bins]))
    line_plot(path, series, xlabel="confidence", ylabel="accuracy", diagonal="perfect calibration")
