"""A torch-free engine for runtime tests: answers from the job alone, misbehaves on request.

Every question gets a noul computed from the state and the question's name, so an answer is
the same however jobs are batched. A job's `config` steers it: `{"sleep": s}` slows the pass
holding it, `{"until": path}` holds its pass until the file `path` exists (a test's gate; at
most `GATE_SECONDS`), `{"crash": "prepare"|"run"}` ends the process, `{"hang": true}` blocks
its pass, `{"input_error": "prepare"|"run"}` raises RequestInvalid for its first question,
`{"fail": "prepare"|"run"}` raises another exception, `{"cost": n}` sets each row's tokens,
`{"rows": n}` cuts the job into n rows (default 1), `{"unsendable": true}` answers with an
integer msgpack cannot carry.
`spec.options`: `{"log": path}` appends a JSON line at start (the process id and its resident
memory then) and per pass (its jobs' count, rows and states, a state once per row),
`{"fail_start": true}`, `{"start_delay": s}`, `{"print": true}` prints to stdout,
`{"hold_mb": n}` holds n MB in 64 KB heap blocks for the engine's life, as a model's tensors
would; `{"loads": true}` has each checkpoint (a job's `checkpoint`) load on its first use, or
at start for `spec.preload`, reported as a real engine's load, taking `{"load_delay": s}`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from decidealot.contract import NoulAnswer
from decidealot.errors import RequestInvalid
from decidealot.jobs import CheckpointLoad, Decision, EngineSpec, Job
from decidealot.providers.engine.protocol import PassShape, ReportLoad

GATE_SECONDS = 60.0
"""The longest a pass waits for its `until` file: a test that never opens its gate sees the
pass end then, in the order it asserted against, instead of hanging."""


def resident_bytes(pid: int | str = "self") -> int:
    """A process's resident memory, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True)
class ArithRow:
    job: Job
    tokens: int


@dataclass
class ArithPrepared:
    job: Job
    group: str
    rows: list[ArithRow] = field(default_factory=list)

    @property
    def input_tokens(self) -> int:
        return sum(row.tokens for row in self.rows)


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
        raise RequestInvalid.question(question, f"cannot take this at {stage}", ["criteria"])
    if config.get("fail") == stage:
        raise RuntimeError(f"secret state {job.state!r}")


class ArithEngine:
    shape = PassShape()

    def __init__(self, spec: EngineSpec, report: ReportLoad) -> None:
        self._report = report
        self._loads = bool(spec.options.get("loads"))
        self._load_delay = spec.options.get("load_delay", 0)
        self._loaded: set[str] = set()
        self._log_path = spec.options.get("log")
        rss = resident_bytes()
        block = 64 * 1024
        self._held = [bytearray(b"x" * block) for _ in range(spec.options.get("hold_mb", 0) * 16)]
        self._log(
            {
                "start": os.getpid(),
                "rss": rss,
                "device": spec.device,
                "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                "inherited_keys": sorted(k for k in os.environ if k.startswith("DECIDEALOT_")),
            }
        )
        for key in spec.preload:
            self._load(key)

    def _load(self, key: str) -> None:
        if self._loads and key not in self._loaded:
            time.sleep(self._load_delay)
            self._loaded.add(key)
            self._report(CheckpointLoad(key, f"/arith/{key}", "fp32", 0, 0, [], "auto", "arith"))

    def _log(self, record: dict[str, object]) -> None:
        if self._log_path:
            with open(self._log_path, "a") as log:
                log.write(json.dumps(record) + "\n")

    def prepare(self, job: Job) -> ArithPrepared:
        self._load(job.checkpoint)
        _misbehave(job, "prepare")
        cost = job.config.get("cost", len(state_text(job)))
        count = job.config.get("rows", 1)
        return ArithPrepared(job, job.checkpoint, [ArithRow(job, cost) for _ in range(count)])

    def forward(self, group: Hashable, rows: Sequence[ArithRow]) -> list[None]:
        jobs = list({id(row.job): row.job for row in rows}.values())
        states = [row.job.state for row in rows]
        self._log({"size": len(jobs), "rows": len(rows), "states": states})
        time.sleep(max(job.config.get("sleep", 0) for job in jobs))
        for gate in {job.config["until"] for job in jobs if "until" in job.config}:
            _wait_for_file(gate)
        for job in jobs:
            if job.config.get("hang"):
                time.sleep(3600)
            _misbehave(job, "run")
        return [None] * len(rows)

    def finish(self, prepared: ArithPrepared, outputs: Sequence[object]) -> Decision:
        decision = answer(prepared.job)
        if prepared.job.config.get("unsendable"):
            decision.input_tokens = 2**70
        return decision


def _wait_for_file(path: str) -> None:
    deadline = time.monotonic() + GATE_SECONDS
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def create(spec: EngineSpec, report: ReportLoad) -> ArithEngine:
    if spec.options.get("print"):
        print("stray output from an engine")
    time.sleep(spec.options.get("start_delay", 0))
    if spec.options.get("fail_start"):
        raise FileNotFoundError("secret checkpoint path /nowhere")
    return ArithEngine(spec, report)
