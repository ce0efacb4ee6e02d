"""`decidealot evaluate`'s options: argparse only, so building `decidealot`'s parser stays cheap
(the command itself, `decidealot.evaluate.command`, is imported when it runs)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit


def add_parser(commands: Any) -> None:
    """The `evaluate` subcommand's options, on `decidealot`'s parser."""
    evaluate = commands.add_parser(
        "evaluate",
        help="score a model as served on labelled rows; thresholds, a CI gate (docs/evaluate.md)",
        description="Answer labelled rows with any model of the catalog, as served (in this "
        "process, or a running server with --url), through the batch path; report laya-evals' "
        "metrics, per question the coverage and error at each threshold, and gate on limits or "
        "a baseline. Exit 0: every limit holds; 1: one fails; 2: a usage error.",
    )
    evaluate.add_argument(
        "data", help="JSON lines: {state, questions, expected} (laya-evals) or {state, question, "
        "gold} (von calibrate)"
    )  # fmt: skip
    evaluate.add_argument("--model", required=True, help="the model selector to evaluate")
    evaluate.add_argument(
        "--url", type=_base_url, help="a running Decidealot to ask (key: DECIDEALOT_API_KEY)"
    )
    evaluate.add_argument("--key-file", help="with --url: a file whose first line is the key")
    evaluate.add_argument(
        "--batch-size", type=int, default=32, help="rows per batch request (default 32)"
    )
    evaluate.add_argument(
        "--timeout", type=float, default=600.0, help="with --url: seconds for one batch (600)"
    )
    evaluate.add_argument("--json", dest="json_out", help="write the full report JSON here")
    evaluate.add_argument("--plot", help="draw each question's risk-coverage curve as a PNG")
    evaluate.add_argument(
        "--max-error", type=float, help="per question, the lowest threshold with error <= this"
    )
    evaluate.add_argument(
        "--score-within", type=float, action="append", metavar="K",
        help="also report score_within_K (repeatable)",
    )  # fmt: skip
    evaluate.add_argument("--min-accuracy", type=float, help="minimum accuracy (choice, else noul)")
    evaluate.add_argument("--max-ece", type=float, help="maximum expected calibration error")
    evaluate.add_argument("--min", action="append", metavar="METRIC=VALUE", help="a minimum")
    evaluate.add_argument("--max", action="append", metavar="METRIC=VALUE", help="a maximum")
    evaluate.add_argument("--baseline", help="a report (--json) to compare against")
    evaluate.add_argument(
        "--tolerance", action="append", metavar="METRIC=VALUE",
        help="allowed absolute drift from the baseline (repeatable; 0 unless given)",
    )  # fmt: skip


def _base_url(raw: str) -> str:
    try:
        url = urlsplit(raw.strip())
        host, user = url.hostname, url.username
    except ValueError:
        raise argparse.ArgumentTypeError("expected an http:// or https:// URL") from None
    if url.scheme not in ("http", "https") or not host:
        raise argparse.ArgumentTypeError("expected an http:// or https:// URL")
    if user is not None:  # a key belongs in DECIDEALOT_API_KEY or --key-file, never in argv
        raise argparse.ArgumentTypeError("put the key in DECIDEALOT_API_KEY, not in the URL")
    return raw.strip().rstrip("/")
