"""What `DECIDEALOT_LONG_STATES=windows` costs against `cut` for one long Laya state.

In this process, no HTTP (the work is the worker's): a Laya english checkpoint with the shipped
budgets (512-token rows, 192 for the question), a string state of about `--tokens` state tokens
(2,000 by default) and three questions (choice of 3, score of 3, noul). Per mode, the engine
prepares the request and runs its rows through the worker's planner (`run_together`) with the
worker's default CPU turn budget; the median of `--repeats` wall times is reported, with the
rows, `usage.input_tokens` and how many of the state's tokens each question read. One torch
thread unless `--threads`.

    .venv/bin/python bench/long_states.py                 # tiny512: real budgets, tiny compute
    .venv/bin/python bench/long_states.py --size base     # ModernBERT-base's encoder shape
    .venv/bin/python bench/long_states.py --device cuda --size base
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decidealot.contract import Question
from decidealot.jobs import EngineSpec, Job
from decidealot.providers.engine.planner import run_together
from decidealot.providers.laya.tiny import build_laya_checkpoint
from decidealot.providers.laya.worker.engine import create

QUESTIONS = {
    "category": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"billing": "Payments and refunds", "shipping": None, "account": None},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["routine", "important", "urgent"],
    },
    "needs_human": {"type": "noul", "instructions": "Does a person need to read it?"},
}
SENTENCES = (
    "The customer wrote again about order 84213, which was charged twice last month.",
    "Support answered that the duplicate payment would be refunded within five days.",
    "The refund has not arrived and the customer asks to close the account.",
    "Shipping was late by twelve days and the invoice lists three items.",
)
CPU_TURN_TOKENS = 4096
"""`DECIDEALOT_BATCH_TOKEN_BUDGET`'s CPU default."""


def state_of(tokens: int, count: Callable[[str], int]) -> str:
    """Sentences in turn until the text has at least `tokens` tokens."""
    sentences: list[str] = []
    while count(" ".join(sentences)) < tokens:
        sentences.append(SENTENCES[len(sentences) % len(SENTENCES)])
    return " ".join(sentences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny512", choices=("tiny512", "base"))
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    questions = msgspec.convert(QUESTIONS, dict[str, Question])
    with tempfile.TemporaryDirectory() as folder:
        path = build_laya_checkpoint(Path(folder) / "english", "english", size=args.size)
        engines = {
            mode: create(
                EngineSpec(
                    factory="decidealot.providers.laya.worker.engine:create",
                    checkpoints={"english": str(path)},
                    preload=["english"],
                    device=args.device,
                    options={"long_states": mode},
                )
            )
            for mode in ("cut", "windows")
        }
        tokenizer = engines["cut"]._checkpoint("english").tokenizer

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        state = state_of(args.tokens, count)
        job = Job("english", state, questions)
        budget = CPU_TURN_TOKENS if args.device == "cpu" else 32768
        print(f"laya english {args.size}, {args.device}, {args.threads} thread(s)")
        print("| mode | rows | usage.input_tokens | state tokens read per question | median s |")
        print("|---|---|---|---|---|")
        for mode, engine in engines.items():
            run_together(engine, [engine.prepare(job)], budget)  # warm
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                prepared = engine.prepare(job)
                (decision,) = run_together(engine, [prepared], budget)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - started)
            reads = ", ".join(f"{c.read}/{c.total}" for c in decision.cuts) or f"all {count(state)}"
            print(
                f"| {mode} | {len(prepared.rows)} | {decision.input_tokens} | {reads} "
                f"| {statistics.median(times):.3f} |"
            )


if __name__ == "__main__":
    main()
