"""Laya temperatures fitted on the user's labels, by laya 0.4.15's own method and in its format:
`records_from_labeled` + `Agent.fit_temperatures` + `Agent.save_calibration` (docs/models.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decidealot.providers import calibrate
from decidealot.providers.json_files import read_json_object
from decidealot.providers.laya import calibration
from decidealot.providers.laya.calibration import QTYPE_NAMES, TEMPERATURE_MAX, TEMPERATURE_MIN
from decidealot.providers.laya.worker.engine import LayaPreparedJob
from decidealot.providers.laya.worker.render import QTYPES, question_type
from decidealot.providers.worker.readout import softmax

MIN_BUCKET_N = 2000
MIN_TYPE_N = 10
LOG_T_MARGIN = 10.0  # laya's search band: this many e-folds outside [0.5, 5] on log T


@dataclass(frozen=True)
class Record:
    """laya's `(qtype, logits, target, k)`, with the target as the gold option's index."""

    qtype: int
    logits: list[float]
    gold: int

    @property
    def bucket(self) -> str:
        return calibration.temperature_bucket(QTYPE_NAMES[self.qtype], len(self.logits))


def _fit_unclamped(records: Sequence[Record]) -> float:
    """laya's `_fit_unclamped_temperature`: one scale by NLL, LBFGS on log T."""
    groups: dict[int, list[Record]] = {}
    for record in records:
        groups.setdefault(len(record.logits), []).append(record)
    matrices = []
    for width in sorted(groups):
        rows = groups[width]
        logits = torch.tensor([r.logits for r in rows], dtype=torch.float32)
        target = torch.zeros(len(rows), width, dtype=torch.float32)
        target[torch.arange(len(rows)), torch.tensor([r.gold for r in rows])] = 1.0
        matrices.append((logits, target))
    n_rows = float(len(records))
    log_lo = math.log(TEMPERATURE_MIN) - LOG_T_MARGIN
    log_hi = math.log(TEMPERATURE_MAX) + LOG_T_MARGIN
    with torch.enable_grad():
        log_t = torch.zeros(1, requires_grad=True)
        optimiser = torch.optim.LBFGS([log_t], lr=0.1, max_iter=100)

        def closure() -> torch.Tensor:
            optimiser.zero_grad()
            scale = log_t.clamp(min=log_lo, max=log_hi).exp()
            nll = sum(-(t * torch.log_softmax(z / scale, -1)).sum(-1).sum() for z, t in matrices)
            loss = nll / n_rows
            loss.backward()
            return loss

        optimiser.step(closure)  # type: ignore[arg-type]
    return float(log_t.detach().clamp(min=log_lo, max=log_hi).exp().item())


@dataclass(frozen=True)
class Fit:
    temperature: list[float]
    temperature_by_options: dict[str, float]
    clamped: dict[str, float]  # the fits the clamp moved: entry -> the unclamped optimum
    by_type: list[int]  # rows per question type


def fit_temperatures(records: Sequence[Record]) -> Fit:
    """laya's `fit_temperature_map(records)` (`compute_ece=False`, the path it installs)."""
    by_type: list[list[Record]] = [[] for _ in QTYPE_NAMES]
    by_bucket: dict[str, list[Record]] = {}
    for record in records:
        by_type[record.qtype].append(record)
        by_bucket.setdefault(record.bucket, []).append(record)
    clamped: dict[str, float] = {}

    def fitted(name: str, rows: list[Record]) -> float:
        raw = _fit_unclamped(rows)
        value = calibration.clamp_temperature(raw)
        if math.isfinite(raw) and value != raw:
            clamped[name] = raw
        return value

    temperature = [
        fitted(QTYPE_NAMES[qtype], rows) if len(rows) >= MIN_TYPE_N else 1.0
        for qtype, rows in enumerate(by_type)
    ]
    by_options = {k: fitted(k, rows) for k, rows in by_bucket.items() if len(rows) >= MIN_BUCKET_N}
    return Fit(temperature, by_options, clamped, [len(rows) for rows in by_type])


def _read(prepared: LayaPreparedJob, outputs: Sequence[object]) -> tuple[int, list[float]]:
    """A one-question job's question type and option logits (what laya records)."""
    (question,) = prepared.questions.values()
    logits: list[float] = list(outputs[0])  # type: ignore[call-overload]
    return QTYPES[question_type(question)], logits


def _summary(fit: Fit) -> list[str]:
    lines = ["fitted (laya 0.4.15's temperature fit):"]
    for qtype, name in enumerate(QTYPE_NAMES):
        rows = fit.by_type[qtype]
        value = fit.temperature[qtype]
        if rows < MIN_TYPE_N:
            note = f"not fitted, {rows} rows is under laya's floor of {MIN_TYPE_N}: 1.0"
        elif name in fit.clamped:
            note = f"{value:g} (the fit wanted {fit.clamped[name]:.4g}, clamped to [0.5, 5])"
        else:
            note = f"{value:.4f}"
        lines.append(f"  {name}: temperature {note} ({rows} rows)")
    for key, value in fit.temperature_by_options.items():
        lines.append(f"  {key}: temperature {value:.4f}")
    if not fit.temperature_by_options:
        lines.append(
            f"  no option-count bucket reached laya's floor of {MIN_BUCKET_N} rows: "
            "each type's temperature covers all of its buckets"
        )
    return lines


def fit(setup: calibrate.Setup) -> calibrate.Outcome:
    engine = calibrate.build(setup, "decidealot.providers.laya.worker.engine:create")
    rows, skipped = calibrate.collect(engine, _read, setup)  # type: ignore[arg-type]
    records = [Record(*r.record, r.label.gold) for r in rows]
    fitted = fit_temperatures(records)
    config = read_json_object(setup.checkpoint / "rl_agent_config.json", ValueError)
    body = calibration.payload(
        fitted.temperature,
        fitted.temperature_by_options,
        model_id_or_path=str(setup.checkpoint),
        config=config,
    )
    outcome = calibrate.Outcome(body, _summary(fitted), len(rows), skipped)
    if len(records) >= 2:
        after: dict[int, list[float]] = {}
        for held in calibrate.folds_of(len(records), setup.folds, setup.seed)[1]:
            kept = set(held)
            trained = fit_temperatures([r for i, r in enumerate(records) if i not in kept])
            temperatures = calibration.Temperatures(
                trained.temperature, trained.temperature_by_options
            )
            for i in held:
                record = records[i]
                scale = temperatures.get(QTYPE_NAMES[record.qtype], len(record.logits))
                after[i] = softmax(record.logits, scale)
        outcome.held_out(rows, after)
    return outcome
