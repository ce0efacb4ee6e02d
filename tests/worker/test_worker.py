"""The worker process on its own: frames in, frames out, batching, failures, exit."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest

from decidealot.contract import NoulQuestion, ValidationIssue
from decidealot.jobs import EngineSpec, Job
from decidealot.providers.engine.planner import STARVE_TURNS, Planner
from decidealot.providers.engine.protocol import (
    Cancel,
    Failed,
    FromWorker,
    Heartbeat,
    JobFailed,
    PassDone,
    PassShape,
    Ready,
    Rejected,
    Release,
    Result,
    Start,
    Submit,
    decode_from_worker,
    encode,
    read_payload,
)
from tests.support.engines.arith import answer

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Tokens:
    tokens: int


@dataclass
class Rows:
    group: str
    rows: list[Tokens]

    @property
    def input_tokens(self) -> int:
        return sum(row.tokens for row in self.rows)


def planner(budget: int, *jobs: tuple[str, list[int]], shape: PassShape | None = None) -> Planner:
    plan = Planner(budget, shape or PassShape())
    for job_id, (group, lengths) in enumerate(jobs):
        plan.add(job_id, Rows(group, [Tokens(n) for n in lengths]))
    return plan


def turn(plan: Planner) -> list[list[tuple[int, int]]]:
    """The next turn as (job id, row tokens) per pass; its rows count as computed."""
    passes = plan.take()
    for each in passes:
        for job, _ in each.rows:
            job.running -= 1
    return [[(j.id, j.prepared.rows[i].tokens) for j, i in each.rows] for each in passes]


def test_a_turn_takes_the_job_of_fewest_turns_first_within_the_budget() -> None:
    plan = planner(100, ("a", [40, 40, 40, 40]), ("a", [10, 20]), ("b", [5]))
    # jobs 1 and 2 fit in one turn, job 0 needs two: job 1, the older of the two, goes
    # first, and job 0 (its group) fills what the budget leaves; job 2's group waits
    assert turn(plan) == [[(1, 10), (1, 20), (0, 40)]]
    # job 2 is a job of one turn, job 0 (160 tokens) of two
    assert turn(plan) == [[(2, 5)]]
    assert turn(plan) == [[(0, 40), (0, 40)]]
    assert turn(plan) == [[(0, 40)]]
    assert turn(plan) == []


def test_jobs_that_fit_in_a_turn_are_served_in_arrival_order() -> None:
    plan = planner(100, ("a", [30, 30, 30]), ("a", [20, 20, 20]), ("a", [10, 10]))
    # all three fit in a turn: the oldest first, however long, not the shortest
    assert turn(plan) == [[(0, 30), (0, 30), (0, 30)]]
    assert turn(plan) == [[(2, 10), (2, 10), (1, 20), (1, 20), (1, 20)]]


def test_shorter_newcomers_never_overtake_an_equal_sized_older_job() -> None:
    """Equal requests differ by a few tokens; each turn holds one, and every turn a slightly
    shorter one arrives. Each is served in arrival order, none waits for the starvation
    guard (ordering by exact remaining tokens made job 1 wait `STARVE_TURNS` turns)."""
    plan = planner(100, ("a", [90]), ("a", [89]))
    served = []
    for n in range(2, 2 * STARVE_TURNS + 2):
        served += [job for each in turn(plan) for job, _ in each]
        plan.add(n, Rows("a", [Tokens(90 - n)]))
    assert served == list(range(2 * STARVE_TURNS))


def test_a_job_the_budget_cut_goes_on_first_when_the_queue_is_long() -> None:
    """A queue of equal jobs longer than `STARVE_TURNS` turns, where the budget ends inside a
    job in most turns: rows are served job by job in arrival order, the cut job's rest first
    in the next turn. (Counting every wait as starving made the newer jobs that had waited 8
    turns jump ahead of the cut job, whose count its first rows had reset, and it waited
    behind all of them: the 4x-p50 tail at 32 clients.)"""
    jobs = 4 * STARVE_TURNS
    plan = planner(100, *[("a", [25, 25, 25])] * jobs)
    served = []
    while passes := turn(plan):
        served += [job for each in passes for job, _ in each]
    assert served == [job for job in range(jobs) for _ in range(3)]


def test_a_turn_always_holds_one_row_even_over_the_budget() -> None:
    plan = planner(100, ("a", [500, 1]))
    assert turn(plan) == [[(0, 1)]]
    assert turn(plan) == [[(0, 500)]]


def test_a_small_job_arriving_during_a_large_one_gets_the_next_turn() -> None:
    plan = planner(100, ("a", [50] * 20))
    assert turn(plan) == [[(0, 50), (0, 50)]]
    plan.add(7, Rows("a", [Tokens(30)]))
    assert turn(plan) == [[(7, 30), (0, 50)]]


def test_a_large_jobs_last_turn_does_not_go_before_a_small_one() -> None:
    plan = planner(100, ("a", [60, 60, 60]))
    assert turn(plan) == [[(0, 60)]]
    assert turn(plan) == [[(0, 60)]]  # one turn's work left, but still a job of two turns
    plan.add(7, Rows("a", [Tokens(50)]))
    assert turn(plan) == [[(7, 50)]]
    assert turn(plan) == [[(0, 60)]]


def test_a_job_passed_over_too_long_goes_first() -> None:
    plan = planner(10, ("big", [10] * 3))
    for n in range(STARVE_TURNS):
        plan.add(100 + n, Rows("small", [Tokens(1)]))
        assert turn(plan) == [[(100 + n, 1)]]  # shorter jobs of another group go first
    plan.add(200, Rows("small", [Tokens(1)]))
    assert turn(plan) == [[(0, 10)]]  # overtaken STARVE_TURNS times: its turn now


def test_turns_are_cut_into_passes_by_the_engines_shape() -> None:
    plan = planner(1000, ("a", [10, 10, 12, 40, 41]), shape=PassShape(max_tokens=60, max_waste=8))
    # sorted by length; 10,10,12 pad to 36 (waste 4); 40 would waste 80; 40+41 pad to 82 > 60
    assert turn(plan) == [[(0, 10), (0, 10), (0, 12)], [(0, 40)], [(0, 41)]]


def test_a_withdrawn_job_leaves_the_planner() -> None:
    plan = planner(100, ("a", [50, 50, 50]), ("a", [60]))
    plan.remove(0)
    assert turn(plan) == [[(1, 60)]]
    assert turn(plan) == [] and len(plan) == 1  # job 1 is complete, for its caller to remove


HEARTBEAT = 0.02


class WorkerProcess:
    """A worker subprocess driven with the blocking frame helpers."""

    def __init__(
        self,
        options: dict[str, object],
        budget: int = 10_000,
        passes: int = 1,
        job_token_limit: int = 0,
        preload: tuple[str, ...] = (),
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "decidealot.providers.engine"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.spec = EngineSpec(
            "tests.support.engines.arith:create", {}, list(preload), options=options
        )
        self.start = Start(self.spec, budget, passes, job_token_limit, HEARTBEAT)
        self.send(self.start)
        self.progress: list[PassDone] = []
        """The `PassDone` frames `receive` skipped, in order."""
        self.beats: list[Heartbeat] = []
        """The `Heartbeat` frames `receive` skipped, in order."""
        self._held: list[FromWorker | None] = []
        """Frames read while waiting for passes to begin, for `receive`."""
        self._running = 0

    @property
    def stdin(self) -> BinaryIO:
        assert self.process.stdin is not None
        return self.process.stdin

    def send(self, frame: Start | Submit | Cancel | Release) -> None:
        self.stdin.write(encode(frame))
        self.stdin.flush()

    def _read(self) -> FromWorker | None:
        assert self.process.stdout is not None
        payload = read_payload(self.process.stdout)
        return None if payload is None else decode_from_worker(payload)

    def _keep(self, frame: FromWorker | None) -> bool:
        """Whether `frame` is a pass report or heartbeat, now in `progress` or `beats`."""
        if isinstance(frame, PassDone):
            self.progress.append(frame)
            self._running = 0  # until a heartbeat says what runs now
        elif isinstance(frame, Heartbeat):
            self.beats.append(frame)
            self._running = len(frame.passes)
        return isinstance(frame, PassDone | Heartbeat)

    def receive(self) -> FromWorker | None:
        """The next frame that is not a `PassDone` or `Heartbeat` (those: `progress`, `beats`)."""
        if self._held:
            return self._held.pop(0)
        while self._keep(frame := self._read()):
            pass
        return frame

    def wait_begun(self, count: int = 1) -> None:
        """Until `count` passes have begun (reported done, or running by a heartbeat), keeping
        the other frames read meanwhile for `receive`."""
        while len(self.progress) + self._running < count:
            frame = self._read()
            if not self._keep(frame):
                assert frame is not None, "the worker ended before the pass began"
                self._held.append(frame)

    def finish(self) -> tuple[int, str]:
        """Close stdin; the exit code and everything the worker wrote to stderr."""
        self.stdin.close()
        code = self.process.wait(timeout=10)
        assert self.process.stderr is not None
        return code, self.process.stderr.read().decode()


def job(state: str, **config: object) -> Job:
    return Job("ckpt", state, {"q": NoulQuestion(), "r": NoulQuestion()}, config=dict(config))


def test_worker_reports_ready_on_a_clean_stdout_and_answers_jobs() -> None:
    worker = WorkerProcess({"print": True})
    assert worker.receive() == Ready("cpu")  # the engine's print did not reach the frames
    jobs = {7: job("first"), 9: job("second")}
    for job_id, each in jobs.items():
        worker.send(Submit(job_id, each))
    answers = {frame.id: frame for frame in (worker.receive(), worker.receive())}
    assert answers == {job_id: Result(job_id, answer(each)) for job_id, each in jobs.items()}
    code, stderr = worker.finish()
    assert code == 0
    assert "stray output from an engine" in stderr


def test_failures_reach_only_their_own_job_in_a_shared_pass(tmp_path: Path) -> None:
    worker = WorkerProcess({"log": str(tmp_path / "passes")})
    assert isinstance(worker.receive(), Ready)
    worker.send(Submit(1, job("slow", sleep=1.0)))
    worker.wait_begun()  # the next four queue while the slow pass runs, and share one pass
    worker.send(Submit(2, job("fine")))
    worker.send(Submit(3, job("bad input at run", input_error="run")))
    worker.send(Submit(4, job("engine bug", fail="run")))
    worker.send(Submit(5, job("bad input at prepare", input_error="prepare")))
    worker.send(Submit(6, job("also fine")))
    worker.send(Submit(7, job("answer too big for msgpack", unsendable=True)))
    frames = {frame.id: frame for frame in (worker.receive() for _ in range(7)) if frame}
    assert frames[1] == Result(1, answer(job("slow", sleep=1.0)))
    assert frames[2] == Result(2, answer(job("fine")))
    assert frames[6] == Result(6, answer(job("also fine")))
    where = ["questions", "q", "criteria"]
    at_run = ValidationIssue(where, "cannot take this at run", "value_error")
    at_prepare = ValidationIssue(where, "cannot take this at prepare", "value_error")
    assert frames[3] == Rejected(3, [at_run])
    assert frames[5] == Rejected(5, [at_prepare])
    assert frames[4] == JobFailed(4, "RuntimeError")
    assert frames[7] == JobFailed(7, "OverflowError")
    code, stderr = worker.finish()
    assert code == 0
    assert "RuntimeError at arith.py" in stderr
    assert "secret" not in stderr  # exception messages may quote the state: never logged
    passes = (tmp_path / "passes").read_text().splitlines()
    assert '"size": 5' in passes[2]  # all but the one that failed to prepare, in one pass


def run_slow_pair_then_many(passes: int) -> tuple[int, dict[int, FromWorker | None]]:
    """Two one-second jobs, the second sent once the first one's pass is under way, then
    twenty quick ones: the most passes a heartbeat saw running at once, and the answers by
    id."""
    worker = WorkerProcess({}, passes=passes)
    assert isinstance(worker.receive(), Ready)
    worker.send(Submit(1, job("slow one", sleep=1.0)))
    worker.wait_begun()  # the first pass is under way: the second job cannot join it
    worker.send(Submit(2, job("slow two", sleep=1.0)))
    for job_id in range(3, 23):
        worker.send(Submit(job_id, job({"quick": job_id}, sleep=0.01)))
    frames = [worker.receive() for _ in range(22)]  # a job's `PassDone` comes before its answer
    assert worker.finish()[0] == 0
    most = max(len(beat.passes) for beat in worker.beats)
    return most, {frame.id: frame for frame in frames if isinstance(frame, Result)}


def test_compute_threads_run_passes_at_once_with_the_same_answers() -> None:
    one_at_once, one = run_slow_pair_then_many(passes=1)
    two_at_once, two = run_slow_pair_then_many(passes=2)
    # one pass at a time; with two compute threads the second slow job's pass runs on the
    # other one while the first one's runs (for about a second: many heartbeats see both)
    assert (one_at_once, two_at_once) == (1, 2)
    assert len(one) == 22
    assert two == one


def test_a_start_frame_without_a_compute_thread_is_refused() -> None:
    worker = WorkerProcess({}, passes=0)
    assert worker.receive() is None
    code, stderr = worker.finish()
    assert code == 2
    assert "malformed start frame" in stderr


def test_a_failing_factory_reports_failed_and_exits() -> None:
    worker = WorkerProcess({"fail_start": True})
    assert worker.receive() == Failed("FileNotFoundError")
    code, stderr = worker.finish()
    assert code == 1
    assert "FileNotFoundError" in stderr


@pytest.mark.parametrize("busy", [False, True])
def test_worker_exits_when_its_stdin_closes(busy: bool) -> None:
    worker = WorkerProcess({})
    assert isinstance(worker.receive(), Ready)
    if busy:
        worker.send(Submit(1, job("stuck", hang=True)))  # its pass would run for an hour
        worker.wait_begun()
    code, _ = worker.finish()  # within `finish`'s 10 s, not after the hung pass
    assert code == 0


def test_a_torch_free_engines_worker_never_imports_torch() -> None:
    """The worker's own modules leave torch to the engines that use it: a torch-free engine's
    worker (every arith worker of the suite) starts in a fraction of a second, not after
    torch's import of seconds."""
    code = "import sys, decidealot.providers.engine.proc; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


def test_a_malformed_frame_ends_the_worker() -> None:
    worker = WorkerProcess({})
    assert isinstance(worker.receive(), Ready)
    worker.stdin.write(b"\x00\x00\x00\x03abc")
    worker.stdin.flush()
    assert worker.process.wait(timeout=10) == 2


def passes_of(worker: WorkerProcess, job_id: int) -> list[PassDone]:
    return [f for f in worker.progress if job_id in f.jobs]


def test_a_job_of_many_rows_reports_every_pass_within_the_budget() -> None:
    worker = WorkerProcess({}, budget=100)
    assert isinstance(worker.receive(), Ready)
    worker.send(Submit(1, job("many rows", rows=5, cost=40)))
    assert worker.receive() == Result(1, answer(job("many rows", rows=5, cost=40)))
    assert len(worker.progress) == 3  # reported pass by pass
    assert [(p.rows, p.tokens) for p in passes_of(worker, 1)] == [(2, 80), (2, 80), (1, 40)]
    assert worker.finish()[0] == 0


def test_a_small_job_waits_about_one_pass_behind_a_large_one() -> None:
    worker = WorkerProcess({}, budget=100)
    assert isinstance(worker.receive(), Ready)
    large = job("large", rows=20, cost=50, sleep=0.2)  # ten passes of 0.2 s
    worker.send(Submit(1, large))
    worker.wait_begun(2)  # in its second pass: a small job now waits for that pass only
    worker.send(Submit(2, job("small", cost=10)))
    assert worker.receive() == Result(2, answer(job("small", cost=10)))
    assert worker.receive() == Result(1, answer(large))
    large_passes = passes_of(worker, 1)
    (shared,) = [n for n, p in enumerate(large_passes) if 2 in p.jobs]
    assert large_passes[shared].rows == 2  # the small job shared one pass with a large row
    # the pass after the one under way when it came (a pass of slack for a slow reader), not
    # one after the large job's remaining eight
    assert shared <= 3
    assert sum(p.rows for p in passes_of(worker, 1)) == 20 + 1
    assert worker.finish()[0] == 0


def test_a_cancelled_job_is_withdrawn_and_never_answered(tmp_path: Path) -> None:
    log = tmp_path / "passes"
    worker = WorkerProcess({"log": str(log)}, budget=100)
    assert isinstance(worker.receive(), Ready)
    worker.send(Submit(1, job("abandoned", rows=20, cost=50, sleep=0.2)))
    worker.wait_begun(2)  # its second pass is under way
    worker.send(Cancel(1))
    worker.send(Cancel(99))  # unknown ids are ignored
    worker.send(Submit(2, job("next")))
    assert worker.receive() == Result(2, answer(job("next")))
    # a withdrawn job's rows would fill what the budget leaves beside this one: its pass is
    # the window in which they would have run
    worker.send(Submit(3, job("after")))
    assert worker.receive() == Result(3, answer(job("after")))
    code, _ = worker.finish()
    assert code == 0
    assert [p.jobs for p in worker.progress if 3 in p.jobs] == [[3]]
    ran = [json.loads(line) for line in log.read_text().splitlines() if '"rows"' in line]
    abandoned = sum(record["states"].count("abandoned") for record in ran)
    assert abandoned <= 6  # the running pass finished; none of the remaining rows ran


def test_a_cancel_before_prepare_drops_the_job() -> None:
    worker = WorkerProcess({}, budget=100)
    assert isinstance(worker.receive(), Ready)
    worker.send(Submit(1, job("slow", sleep=0.5)))
    worker.wait_begun()
    worker.send(Submit(2, job("gone")))
    worker.send(Cancel(2))
    worker.send(Submit(3, job("kept")))
    assert worker.receive() == Result(1, answer(job("slow", sleep=0.5)))
    assert worker.receive() == Result(3, answer(job("kept")))
    assert worker.finish()[0] == 0


def test_a_job_over_the_token_limit_fails_at_prepare_naming_the_setting() -> None:
    worker = WorkerProcess({}, job_token_limit=100)
    assert isinstance(worker.receive(), Ready)
    worker.send(Submit(1, job("too much", rows=3, cost=40)))
    worker.send(Submit(2, job("fits", rows=2, cost=50)))
    refused = worker.receive()
    assert isinstance(refused, Rejected) and refused.id == 1
    (issue,) = refused.issues
    assert issue.loc == ["questions"]
    assert "costs 120 model tokens" in issue.msg
    assert "DECIDEALOT_MAX_REQUEST_TOKENS" in issue.msg and "at most 100" in issue.msg
    assert worker.receive() == Result(2, answer(job("fits", rows=2, cost=50)))
    assert not passes_of(worker, 1)  # refused before any pass
    assert worker.finish()[0] == 0
