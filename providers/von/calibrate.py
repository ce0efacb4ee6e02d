"""Von's temperature map refitted on the user's labels by von-sdk 1.3.7's `von calibrate`
(docs/models.md, "Fitting one"), on the logits and features of the engine's own pass."""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import torch

from decidealot.contract import NoulQuestion
from decidealot.providers import calibrate
from decidealot.providers.json_files import read_json_object
from decidealot.providers.von.calibration import MAP_FEATURES, CalibrationError
from decidealot.providers.von.worker.engine import VonEngine, VonPreparedJob, features

LO, HI = 0.3, 12.0  # the bounds `von calibrate` writes with every map
RESTARTS, ITERATIONS = 4, 400
PADDING = -1e300  # fills a row out to the widest: exactly 0 in every softmax, and its gradient
FEATURES_TEXT = (
    "T = bias + entropy*H_norm + log_tokens*log10(state_tokens)/4 + n_options*(K/8), "
    "clamped to [lo,hi]"
)
UPSTREAM = "von-sdk 1.3.7"


@dataclass(frozen=True)
class Record:
    """`von calibrate`'s record: logits, the map's features, the gold option (von's order)."""

    logits: list[float]
    feats: dict[str, float]
    gold: int


def _temp(params: dict[str, float], feats: dict[str, float]) -> float:
    raw = sum(params.get(k, 0.0) * feats.get(k, 0.0) for k in MAP_FEATURES)
    return min(HI, max(LO, raw))


def _log_softmax(logits: Sequence[float], t: float) -> list[float]:
    z = [x / t for x in logits]
    m = max(z)
    lse = m + math.log(sum(math.exp(v - m) for v in z))
    return [v - lse for v in z]


def nll(params: dict[str, float], records: Sequence[Record]) -> float:
    total = 0.0
    for r in records:
        total -= _log_softmax(r.logits, _temp(params, r.feats))[r.gold]
    return total / max(len(records), 1)


def top_label_ece(params: dict[str, float], records: Sequence[Record], bins: int = 10) -> float:
    """`von calibrate`'s top-label ECE (10 equal-width bins; empty `params`: T = 1)."""
    buckets: dict[int, list[tuple[float, bool]]] = {}
    for r in records:
        lp = _log_softmax(r.logits, _temp(params, r.feats) if params else 1.0)
        top = max(range(len(lp)), key=lp.__getitem__)
        conf = math.exp(lp[top])
        buckets.setdefault(min(int(conf * bins), bins - 1), []).append((conf, top == r.gold))
    out = 0.0
    for b in buckets.values():
        confidence, accuracy = sum(c for c, _ in b) / len(b), sum(h for _, h in b) / len(b)
        out += len(b) / len(records) * abs(confidence - accuracy)
    return out


def _fit(records: Sequence[Record], keys: Sequence[str], seed: int = 0) -> dict[str, float]:
    """`von calibrate`'s `_fit`: NLL over the map's `keys`, every row in one padded matrix (the
    same sum as upstream's row-by-row loop, in a few operations a step)."""
    width = max(len(r.logits) for r in records)
    x = torch.tensor([[r.feats[k] for k in keys] for r in records], dtype=torch.float64)
    logits = torch.tensor(
        [[*r.logits, *[PADDING] * (width - len(r.logits))] for r in records], dtype=torch.float64
    )
    gold = torch.tensor([[r.gold] for r in records], dtype=torch.long)

    def loss_fn(w: torch.Tensor) -> torch.Tensor:
        t = (x @ w).clamp(LO, HI)
        picked = torch.log_softmax(logits / t[:, None], dim=-1).gather(1, gold)
        return -picked.sum() / len(records)

    best_w, best_loss = None, float("inf")
    rng = random.Random(seed)
    for _ in range(RESTARTS):
        start = [rng.uniform(0.8, 3.0), *(rng.uniform(-1.0, 1.0) for _ in keys[1:])]
        final, w = _descend(loss_fn, torch.tensor(start, dtype=torch.float64))
        if final < best_loss:
            best_loss, best_w = final, w
    assert best_w is not None
    return {k: float(v) for k, v in zip(keys, best_w, strict=True)}


def _descend(
    loss_fn: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """One restart of `_fit`: Adam from `w`, then an LBFGS polish (kept if it fails)."""
    with torch.enable_grad():
        w.requires_grad_(True)
        adam = torch.optim.Adam([w], lr=0.05)
        for _ in range(ITERATIONS):
            adam.zero_grad()
            loss_fn(w).backward()
            adam.step()
        lbfgs = torch.optim.LBFGS([w], max_iter=50, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            lbfgs.zero_grad()
            loss = loss_fn(w)
            loss.backward()
            return loss

        with contextlib.suppress(RuntimeError):
            lbfgs.step(closure)  # type: ignore[arg-type]
        return float(loss_fn(w).detach()), w.detach().clone()


@dataclass(frozen=True)
class CrossValidated:
    nll: float
    folds: list[tuple[list[int], dict[str, float]]]  # (held-out rows, the fit without them)


def cross_validate(
    records: Sequence[Record], keys: Sequence[str], folds: int, seed: int = 0
) -> CrossValidated:
    """`von calibrate`'s `cross_validate`, keeping each fold's fit for the held-out report."""
    order, held_out = calibrate.folds_of(len(records), folds, seed)
    total, fits = 0.0, []
    for held in held_out:
        test = set(held)
        params = _fit([records[i] for i in order if i not in test], keys, seed=seed)
        total += nll(params, [records[i] for i in held]) * len(held)
        fits.append((held, params))
    return CrossValidated(total / len(records), fits)


def fit_map(records: Sequence[Record], folds: int, seed: int, shipped: Any) -> dict[str, Any]:
    """`von calibrate`'s `fit_map`, and the winner's folds (`cv`) for the held-out scores."""
    scalar_cv = cross_validate(records, ("bias",), folds, seed)
    map_cv = cross_validate(records, MAP_FEATURES, folds, seed)
    scalar = _fit(records, ("bias",), seed=seed)
    full = _fit(records, MAP_FEATURES, seed=seed)
    winner_name = "map" if map_cv.nll < scalar_cv.nll else "scalar"
    winner = dict(full if winner_name == "map" else scalar)
    for k in MAP_FEATURES:
        winner.setdefault(k, 0.0)
    winner["lo"], winner["hi"] = LO, HI
    fits = {"raw_T1": {"bias": 1.0}, "scalar": scalar, "map": full}  # raw_T1: T is exactly 1
    if isinstance(shipped, dict):
        fits["shipped"] = shipped
    report: dict[str, Any] = {
        "n": len(records),
        "folds": folds,
        "cv_nll": {"scalar": round(scalar_cv.nll, 4), "map": round(map_cv.nll, 4)},
        "in_sample_nll": {name: round(nll(params, records), 4) for name, params in fits.items()},
        "ece": {name: round(top_label_ece(params, records), 4) for name, params in fits.items()},
        "scalar_temperature": round(scalar["bias"], 4),
        "winner": winner_name,
    }
    cv = map_cv if winner_name == "map" else scalar_cv
    return {"calibration_map": winner, "report": report, "cv": cv}


def _read(
    engine: VonEngine, prepared: VonPreparedJob, outputs: Sequence[object]
) -> tuple[list[float], dict[str, float]]:
    """A one-question job's logits as its temperature divides them, and the map's features."""
    logits, tokens = engine.tempered(prepared, outputs)
    return logits.float().cpu().tolist(), features(logits, tokens)


def _von_order(row: calibrate.LabelRow[Any]) -> tuple[int, bool]:
    """Gold in von's option order (a noul's: [yes, no], not [false, true]), and whether a noul."""
    noul = isinstance(row.label.question, NoulQuestion)
    return (1 - row.label.gold if noul else row.label.gold), noul


def fit(setup: calibrate.Setup) -> calibrate.Outcome:
    engine = calibrate.build(setup, "decidealot.providers.von.worker.engine:create")
    assert isinstance(engine, VonEngine)
    rows, skipped = calibrate.collect(
        engine,
        lambda prepared, outputs: _read(engine, prepared, outputs),  # type: ignore[arg-type]
        setup,
    )
    records = [Record(*row.record, _von_order(row)[0]) for row in rows]
    current = read_json_object(
        setup.current or setup.checkpoint / "marker_calibration.json", CalibrationError
    )
    if len(records) < 2:
        raise ValueError(f"{len(records)} usable rows: a cross-validated fit needs at least 2")
    fitted = fit_map(records, setup.folds, setup.seed, current.get("calibration_map"))
    body = {k: v for k, v in current.items() if not k.startswith("calibration_")}
    body["calibration_map"] = {k: round(v, 4) for k, v in fitted["calibration_map"].items()}
    body["calibration_map_features"] = FEATURES_TEXT
    report = fitted["report"]
    body["calibration_fitted_on"] = (
        f"decidealot calibrate: {report['n']} labelled rows from "
        f"{os.path.basename(setup.labels_path)}; objective NLL; "
        f"{report['folds']}-fold CV chose {report['winner']}"
    )
    body["calibration_report"] = report
    body["calibration_timestamp"] = time.time()
    body["calibrated_with_engine"] = f"decidealot {version('decidealot')} ({UPSTREAM}'s method)"
    body.setdefault("weights_id", body.get("model_id"))
    summary = [
        f"fitted ({UPSTREAM}'s cross-validated temperature map):",
        f"  {report['folds']}-fold CV NLL: scalar {report['cv_nll']['scalar']}, "
        f"map {report['cv_nll']['map']} -> {report['winner']} written",
        "  "
        + ", ".join(f"{k} {body['calibration_map'][k]:g}" for k in (*MAP_FEATURES, "lo", "hi")),
    ]
    outcome = calibrate.Outcome(body, summary, len(rows), skipped)
    after: dict[int, list[float]] = {}
    for held, params in fitted["cv"].folds:
        for i in held:
            record, row = records[i], rows[i]
            probs = torch.softmax(
                torch.tensor(record.logits) / max(_temp(params, record.feats), 1e-4), dim=-1
            ).tolist()
            after[i] = probs[::-1] if _von_order(row)[1] else probs
    outcome.held_out(rows, after)
    return outcome
