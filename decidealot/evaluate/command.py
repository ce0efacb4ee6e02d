"""`decidealot evaluate DATA --model SELECTOR`: the run, from rows to report and exit status.

Exit status as laya-evals': 0 when every limit and tolerance holds, 1 when one fails (or the
service could not answer), 2 for a usage error (a bad row, option, setting or baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decidealot import config
from decidealot.contract import SystemOneResponse
from decidealot.evaluate import gate, metrics, thresholds
from decidealot.evaluate.answering import (
    Answerer,
    AtUrl,
    InService,
    KeyRefused,
    NotServed,
    Refused,
    Unanswered,
)
from decidealot.evaluate.rows import EvalRow, RowError, file_sha256, questions_sha256, read_rows

USAGE, FAILED = 2, 1


class UsageError(ValueError):
    """A usage error: exit 2 with this message."""


def _say(message: str) -> None:
    print(f"decidealot evaluate: {message}", file=sys.stderr, flush=True)


def evaluate_command(settings: config.Settings, args: argparse.Namespace) -> int:
    """The whole run; the exit status."""
    try:
        plan = _plan(args)
        examples = read_rows(Path(args.data))
        key = _key(settings, args)
    except (UsageError, RowError, gate.GateError) as exc:
        _say(str(exc))
        return USAGE
    if args.url is None:
        from decidealot import preflight

        try:
            preflight.ready_to_serve(settings, progress=sys.stderr.isatty(), rehash=False)
        except preflight.ERRORS as exc:
            _say(str(exc))
            return USAGE if isinstance(exc, config.ConfigError) else FAILED
    try:
        answered = asyncio.run(_answer(settings, args, key, examples))
    except NotServed as exc:
        _say(f"--model {args.model}: {exc}")
        return USAGE
    except (KeyRefused, Refused) as exc:
        _say(str(exc))
        return USAGE
    except Unanswered as exc:
        _say(str(exc))
        return FAILED
    report = _report(args, plan, examples, *answered)
    return _finish(args, plan, report)


@dataclass(frozen=True)
class _GatePlan:
    metrics: list[metrics.Metric]
    mins: dict[str, float]
    maxs: dict[str, float]
    tolerances: dict[str, float]
    baseline: dict[str, Any] | None


def _plan(args: argparse.Namespace) -> _GatePlan:
    """Every option checked before any model runs: a bad one costs nothing."""
    if args.batch_size < 1:
        raise UsageError("--batch-size: expected an integer of at least 1")
    if not args.timeout > 0:
        raise UsageError("--timeout: expected a number of seconds above 0")
    if args.key_file and not args.url:
        raise UsageError("--key-file: only with --url (this process's service needs no key)")
    if args.max_error is not None and not 0 <= args.max_error <= 1:
        raise UsageError("--max-error: expected an error rate from 0 to 1")
    within = []
    for k in args.score_within or []:
        if not math.isfinite(k) or k < 0:
            raise UsageError(f"--score-within: expected a finite number of at least 0, got {k:g}")
        within.append(metrics.score_within(k))
    mins, maxs = gate.pairs(args.min, "--min"), gate.pairs(args.max, "--max")
    for option, value in (("--min-accuracy", args.min_accuracy), ("--max-ece", args.max_ece)):
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{option}: expected a finite number")
    if args.max_ece is not None:
        maxs["ece"] = args.max_ece
    tolerances = gate.pairs(args.tolerance, "--tolerance")
    if tolerances and not args.baseline:
        raise UsageError("--tolerance: only with --baseline")
    baseline = gate.load_report(Path(args.baseline)) if args.baseline else None
    return _GatePlan([*metrics.DEFAULT_METRICS, *within], mins, maxs, tolerances, baseline)


def _key(settings: config.Settings, args: argparse.Namespace) -> str | None:
    """The bearer key for `--url`: `--key-file`'s first line, else DECIDEALOT_API_KEY's first."""
    if args.key_file:
        try:
            lines = Path(args.key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--key-file {args.key_file}: cannot be read ({exc})") from None
        key = next((line.strip() for line in lines if line.strip()), "")
        if not key:
            raise UsageError(f"--key-file {args.key_file}: holds no key")
        return key
    return settings.api_key[0] if settings.api_key else None


Answered = tuple[
    list[SystemOneResponse], list[float], list[float], list[dict[str, Any]], list[dict[str, Any]]
]


async def _answer(
    settings: config.Settings, args: argparse.Namespace, key: str | None, examples: list[EvalRow]
) -> Answered:
    """Every row's response, in order, a batch at a time; each row's wait and share of its
    batch's time (ms); the states a model read only in part (by row line); the checkpoints that
    answered."""
    answerer: InService | AtUrl = (
        InService(settings) if args.url is None else AtUrl(args.url, key, args.timeout)
    )
    async with answerer.running():
        return await _ask(answerer, args.model, args.batch_size, args.data, examples)


async def _ask(
    answerer: Answerer, selector: str, size: int, data: str, examples: list[EvalRow]
) -> Answered:
    await answerer.check(selector)
    responses: list[SystemOneResponse] = []
    waits: list[float] = []
    shares: list[float] = []
    truncated: list[dict[str, Any]] = []
    for start in range(0, len(examples), size):
        chunk = examples[start : start + size]
        requests = [
            {"model": selector, "state": each.state, "questions": each.questions} for each in chunk
        ]
        began = time.perf_counter()
        try:
            answered, cuts = await answerer.batch(requests)
        except Refused as exc:
            line = chunk[min(exc.index, len(chunk) - 1)].line
            why = f"{data}:{line}: {selector} refused it: {exc.message}"
            raise Refused(exc.index, why) from None
        elapsed = (time.perf_counter() - began) * 1000.0
        if len(answered) != len(chunk):
            raise Unanswered(f"a batch of {len(chunk)} came back with {len(answered)} answers")
        responses += answered
        truncated += [
            {"line": chunk[cut.item].line, "question": cut.question, "read": cut.read}
            | {"total": cut.total}
            for cut in cuts
            if cut.item is not None and cut.item < len(chunk)
        ]
        waits += [elapsed] * len(chunk)
        shares += [elapsed / len(chunk)] * len(chunk)
        _say(f"{len(responses)}/{len(examples)} rows")
    return responses, waits, shares, truncated, await answerer.checkpoints(selector)


def _report(
    args: argparse.Namespace,
    plan: _GatePlan,
    examples: Sequence[EvalRow],
    responses: Sequence[SystemOneResponse],
    waits: Sequence[float],
    shares: Sequence[float],
    truncated: list[dict[str, Any]],
    checkpoints: list[dict[str, Any]],
) -> dict[str, Any]:
    cases = []
    for each, response in zip(examples, responses, strict=True):
        for qid, expected in each.expected.items():
            cases.append(
                metrics.case(
                    qid,
                    metrics.answer_record(response.answers[qid]),
                    expected,
                    plan.metrics,
                    model=response.model,
                    tags=each.tags,
                    language=each.language,
                )
            )
    overall = metrics.aggregate(cases, plan.metrics)
    overall["latency_p50_ms"], overall["latency_p95_ms"] = metrics.percentiles(waits)
    cost = metrics.percentiles(shares)
    overall["cost_per_decision_p50_ms"], overall["cost_per_decision_p95_ms"] = cost
    data = Path(args.data)
    identity = {
        "schema": gate.SCHEMA,
        "dataset": args.data,
        "dataset_sha256": file_sha256(data),
        "questions_sha256": questions_sha256(list(examples)),
        "coverage_metric_definition": metrics.COVERAGE_METRIC_DEFINITION,
        "selector": args.model,
        "url": args.url,
        "answered": sorted({response.model for response in responses}),
        "checkpoints": checkpoints,
        "truncated": truncated,
        "decidealot_version": importlib.metadata.version("decidealot"),
        "score_within": [float(k) for k in args.score_within or []],
        "max_error": args.max_error,
        "batch_size": args.batch_size,
    }
    return {
        "config": identity,
        "overall": overall,
        "slices": metrics.slices(cases, plan.metrics),
        "thresholds": thresholds.tables(cases, args.max_error),
        "cases": cases,
    }


def _finish(args: argparse.Namespace, plan: _GatePlan, report: dict[str, Any]) -> int:
    """The gate's verdict, the printed summary, the files; the exit status."""
    overall, identity = report["overall"], report["config"]
    mins = dict(plan.mins)
    if args.min_accuracy is not None:
        accuracy = "choice_accuracy" if "choice_accuracy" in overall else "noul_accuracy"
        mins[accuracy] = args.min_accuracy
    identity["thresholds"] = {"min": mins, "max": plan.maxs, "baseline_tolerance": plan.tolerances}
    failures = gate.limit_failures(overall, mins, plan.maxs)
    lines = []
    if plan.baseline is not None:
        try:
            ok, deltas = gate.compare(identity, overall, plan.baseline, plan.tolerances)
        except gate.GateError as exc:
            _say(str(exc))
            return USAGE
        lines += gate.delta_lines(deltas)
        if not ok:
            failures.append("baseline comparison failed")
        reasons = gate.incomparable(identity, plan.baseline)
        if reasons:
            failures.append("baseline is not comparable: " + "; ".join(reasons))
        lines += [f"answered differently: {change}" for change in gate.answered_changes(
            identity, plan.baseline
        )]  # fmt: skip
    report["gate"] = {"failures": failures}
    for name in sorted(overall):
        print(f"{name:<26} {overall[name]:.4f}")
    for line in [*thresholds.lines(report["thresholds"]), *lines]:
        print(line)
    if identity["truncated"]:
        cut = sorted({each["line"] for each in identity["truncated"]})
        shown = ", ".join(map(str, cut[:10])) + (", ..." if len(cut) > 10 else "")
        print(f"rows whose state a model read only in part (docs/api.md): {len(cut)} ({shown})")
    try:
        if args.json_out:
            text = json.dumps(report, ensure_ascii=False, indent=2, sort_keys=True)
            Path(args.json_out).write_text(text + "\n", encoding="utf-8")
        if args.plot:
            from decidealot.providers.plots import line_plot

            series = thresholds.plot_series(report["thresholds"])
            line_plot(Path(args.plot), series, xlabel="coverage", ylabel="error")
            print(f"drew {args.plot}")
    except OSError as exc:
        _say(f"cannot write {exc.filename}: {exc.strerror}")
        return USAGE
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return FAILED if failures else 0
