"""A torch-free engine for runtime tests: answers from the job alone, misbehaves on request.

Every question gets a noul computed from the state and the question's name, so an answer is
the same however jobs are batched. A job's `config` steers it: `{"sleep": s}` slows the pass
holding it, `{"crash": "prepare"|"run"}` ends the process, `{"hang": true}` blocks its pass,
`{"input_error": "prepare"|"run"}` raises DecisionInputError for its first question,
`{"fail": "prepare"|"run"}` raises another exception, `{"cost": n}` sets its token cost,
`{"unsendable": true}` answers with an integer msgpack cannot carry.
`spec.options`: `{"log": path}` appends a JSON line at start and per pass (batch size and
states), `{"fail_start": true}`, `{"start_delay": s}`, `{"print": true}` prints to stdout.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from decidealot.contract import NoulAnswer
from decidealot.errors import DecisionInputError
from providers.engine import Decision, EngineSpec, Job


@dataclass
class ArithPrepared:
    job: Job
    cost: int
    group: str


def state_text(job: Job) -> str:
    return json.dumps(job.state, sort_keys=True)


def answer(job: Job) -> Decision:
    """The decision this engine gives `job`, whatever it is batched with."""
    text = state_text(job)
    answers = {
        name: NoulAnswer(noul=sum(map(ord, text + name)) % 997 / 997) for name in job.questions
    }
    return Decision(model=job.checkpoint, answers=answers, input_tokens=len(text))


def _misbehave(job: Job, stage: str) -> None:
    config = job.config
    if config.get("crash") == stage:
        os._exit(3)
    if config.get("input_error") == stage:
        question = next(iter(job.questions))
        raise DecisionInputError(question, f"cannot take this at {stage}", ["criteria"])
    if config.get("fail") == stage:
        raise RuntimeError(f"secret state {job.state!r}")


class ArithEngine:
    def __init__(self, spec: EngineSpec) -> None:
        self._log_path = spec.options.get("log")
        self._log(
            {
                "start": os.getpid(),
                "device": spec.device,
                "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                "inherited_keys": sorted(k for k in os.environ if k.startswith("DECIDEALOT_")),
            }
        )

    def _log(self, record: dict[str, object]) -> None:
        if self._log_path:
            with open(self._log_path, "a") as log:
                log.write(json.dumps(record) + "\n")

    def prepare(self, job: Job) -> ArithPrepared:
        _misbehave(job, "prepare")
        cost = job.config.get("cost", len(state_text(job)))
        return ArithPrepared(job, cost, job.checkpoint)

    def run(self, batch: Sequence[ArithPrepared]) -> list[Decision]:
        self._log({"size": len(batch), "states": [item.job.state for item in batch]})
        time.sleep(max(item.job.config.get("sleep", 0) for item in batch))
        for item in batch:
            if item.job.config.get("hang"):
                time.sleep(3600)
            _misbehave(item.job, "run")
        decisions = [answer(item.job) for item in batch]
        for item, decision in zip(batch, decisions, strict=True):
            if item.job.config.get("unsendable"):
                decision.input_tokens = 2**70
        return decisions


def create(spec: EngineSpec) -> ArithEngine:
    if spec.options.get("print"):
        print("stray output from an engine")
    time.sleep(spec.options.get("start_delay", 0))
    if spec.options.get("fail_start"):
        raise FileNotFoundError("secret checkpoint path /nowhere")
    return ArithEngine(spec)
