"""The worker process on its own: frames in, frames out, batching, failures, exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest

from decidealot.contract import NoulQuestion
from providers.engine import EngineSpec, Job
from providers.frames import (
    Failed,
    FromWorker,
    InputError,
    JobFailed,
    Ready,
    Result,
    Start,
    Submit,
    decode_from_worker,
    read_payload,
    write_frame,
)
from providers.worker import Pending, take_batch
from tests.engines.arith import answer

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Cost:
    cost: int
    group: str


def pending(*items: tuple[str, int]) -> deque[Pending]:
    return deque(Pending(i, Cost(cost, group)) for i, (group, cost) in enumerate(items))


def test_batch_takes_the_oldest_group_in_order_within_the_budget() -> None:
    queue = pending(("a", 30), ("b", 10), ("a", 30), ("a", 50), ("a", 10), ("b", 5))
    batch = take_batch(queue, token_budget=70)
    assert [item.id for item in batch] == [0, 2]  # 0+2 fit; 3 does not, so 4 waits behind it
    assert [item.id for item in queue] == [1, 3, 4, 5]
    assert [item.id for item in take_batch(queue, 70)] == [1, 5]
    assert [item.id for item in take_batch(queue, 70)] == [3, 4]
    assert not queue


def test_batch_always_takes_one_job_even_over_budget() -> None:
    queue = pending(("a", 500), ("a", 1))
    assert [item.id for item in take_batch(queue, 100)] == [0]
    assert [item.id for item in take_batch(queue, 100)] == [1]


class WorkerProcess:
    """A worker subprocess driven with the blocking frame helpers."""

    def __init__(self, options: dict[str, object], budget: int = 10_000, passes: int = 1) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "providers.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        spec = EngineSpec(factory="tests.engines.arith:create", checkpoints={}, options=options)
        self.send(Start(spec, budget, concurrent_passes=passes))

    @property
    def stdin(self) -> BinaryIO:
        assert self.process.stdin is not None
        return self.process.stdin

    def send(self, frame: Start | Submit) -> None:
        write_frame(self.stdin, frame)

    def receive(self) -> FromWorker | None:
        assert self.process.stdout is not None
        payload = read_payload(self.process.stdout)
        return None if payload is None else decode_from_worker(payload)

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
    time.sleep(0.2)  # the next four queue while the slow pass runs, and share one pass
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
    assert frames[3] == InputError(3, "q", "cannot take this at run", ["criteria"])
    assert frames[5] == InputError(5, "q", "cannot take this at prepare", ["criteria"])
    assert frames[4] == JobFailed(4, "RuntimeError")
    assert frames[7] == JobFailed(7, "OverflowError")
    code, stderr = worker.finish()
    assert code == 0
    assert "RuntimeError at arith.py" in stderr
    assert "secret" not in stderr  # exception messages may quote the state: never logged
    passes = (tmp_path / "passes").read_text().splitlines()
    assert '"size": 5' in passes[2]  # all but the one that failed to prepare, in one pass


def run_slow_pair_then_many(passes: int) -> tuple[float, dict[int, FromWorker | None]]:
    """Two one-second jobs sent 0.2 s apart, then twenty quick ones: seconds until all are
    answered, and the answers by id."""
    worker = WorkerProcess({}, passes=passes)
    assert isinstance(worker.receive(), Ready)
    started = time.monotonic()
    worker.send(Submit(1, job("slow one", sleep=1.0)))
    time.sleep(0.2)  # the first pass is under way: the second job cannot join it
    worker.send(Submit(2, job("slow two", sleep=1.0)))
    for job_id in range(3, 23):
        worker.send(Submit(job_id, job({"quick": job_id}, sleep=0.01)))
    frames = [worker.receive() for _ in range(22)]
    elapsed = time.monotonic() - started
    assert worker.finish()[0] == 0
    return elapsed, {frame.id: frame for frame in frames if isinstance(frame, Result)}


def test_compute_threads_run_passes_at_once_with_the_same_answers() -> None:
    one_elapsed, one = run_slow_pair_then_many(passes=1)
    two_elapsed, two = run_slow_pair_then_many(passes=2)
    assert one_elapsed >= 2.0  # one pass at a time: the slow jobs run one after the other
    assert two_elapsed < 1.8  # the second slow job ran while the first one's pass did
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
        worker.send(Submit(1, job("stuck", hang=True)))
        time.sleep(0.2)
    started = time.monotonic()
    code, _ = worker.finish()
    assert code == 0
    assert time.monotonic() - started < 3


def test_a_malformed_frame_ends_the_worker() -> None:
    worker = WorkerProcess({})
    assert isinstance(worker.receive(), Ready)
    worker.stdin.write(b"\x00\x00\x00\x03abc")
    worker.stdin.flush()
    assert worker.process.wait(timeout=10) == 2
