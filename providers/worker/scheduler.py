"""The worker's scheduler: one engine's jobs, from `Submit` to their answer frames.

Threads (the gateway's frames arrive on the reader, `process.main`'s thread):

- prepare: runs `engine.prepare` (tokenisation) while the current passes run, and refuses a
  job over `Start.job_token_limit` before any of its rows reaches a pass;
- compute (`Start.concurrent_passes` of them): each takes the planner's next turn
  (`passes`: rows of concurrent jobs, the job of the fewest turns first, within the token
  budget) and runs its passes, announcing each with `PassBegun` and reporting it with
  `PassDone`, so the gateway times passes, not jobs. There is no wait for a batch to fill: a
  turn is whatever waits when a thread is free. Several compute threads let one-thread CPU
  passes use every core; rows are independent, so each job's answer is the same whichever
  rows shared its passes and whichever thread ran them.

A failing pass of several jobs is rerun job by job, so an error reaches only the job that
caused it. A cancelled job's rows not yet in a pass are withdrawn; those in a pass run on and
are dropped. Log lines name exception types and code locations, never exception messages:
those may quote the state.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol, runtime_checkable

import msgspec

from decidealot.errors import RequestInvalid, over_token_limit
from decidealot.frames import (
    Cancel,
    FrameError,
    FromWorker,
    JobFailed,
    Loaded,
    PassBegun,
    PassDone,
    Rejected,
    Release,
    Result,
    Submit,
    decode_to_worker,
    read_payload,
)
from decidealot.jobs import Engine
from decidealot.providers.worker.memory import trim
from decidealot.providers.worker.passes import PlannedJob, PlannedPass, Planner

if TYPE_CHECKING:  # precision imports torch, which a torch-free engine's worker never loads
    from decidealot.providers.worker.precision import CheckpointLoad

log = logging.getLogger("decidealot.worker")


def describe(exc: BaseException) -> str:
    """An exception's type and where it was raised, without its message."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__} at {where}" if where else type(exc).__name__


@runtime_checkable
class ReportsLoads(Protocol):
    """An engine that loads checkpoints (at create, or on a job's first use) says which it
    loaded and in what precision; the scheduler sends each as a `Loaded` frame, for the
    gateway's metrics and log."""

    def take_loaded(self) -> list[CheckpointLoad]:
        """The checkpoints loaded since the last call."""
        ...


class Scheduler:
    """Runs one engine's jobs: prepares them on one thread, plans their rows into passes
    (`passes`) and runs those on `passes` compute threads; every frame it answers with goes
    to `emit` (the frame pipe in a worker process; the in-process runtime's channel in tests
    and benches)."""

    def __init__(
        self,
        engine: Engine,
        emit: Callable[[FromWorker], None],
        token_budget: int,
        passes: int = 1,
        job_token_limit: int = 0,
    ) -> None:
        self._engine = engine
        self._emit = emit
        self._passes = passes
        self._job_token_limit = job_token_limit
        self._incoming: queue.SimpleQueue[Submit | None] = queue.SimpleQueue()
        self._planner = Planner(token_budget, engine.shape)
        self._changed = threading.Condition()
        self._submitted: set[int] = set()
        """Ids received and not yet answered or withdrawn (guarded by `_changed`)."""
        self._cancelled: set[int] = set()
        """Ids cancelled before the planner had them: prepare drops them."""
        self._stopped = False
        self._computing = 0
        """Compute threads running a turn (guarded by `_changed`)."""
        self._threads: list[threading.Thread] = []
        self._loads = engine.take_loaded if isinstance(engine, ReportsLoads) else None

    @property
    def engine(self) -> Engine:
        return self._engine

    def read_jobs(self, stream: BinaryIO) -> None:
        """Receive jobs and cancellations until a `Release` frame; ends the process at the end
        of `stream`."""
        while True:
            try:
                payload = read_payload(stream)
                frame = None if payload is None else decode_to_worker(payload)
            except FrameError:
                log.error("malformed frame from the gateway; exiting")
                os._exit(2)
            if frame is None:
                os._exit(0)  # stdin closed: unloaded, or the gateway died
            if isinstance(frame, Release):
                return
            if isinstance(frame, Submit | Cancel):
                self.receive(frame)
            else:
                log.error("unexpected %s frame; ignored", type(frame).__name__)

    def receive(self, frame: Submit | Cancel) -> None:
        """A job to run, or one whose caller has gone."""
        if isinstance(frame, Submit):
            with self._changed:
                self._submitted.add(frame.id)
            self._incoming.put(frame)
        else:
            self._cancel(frame.id)

    def _cancel(self, job_id: int) -> None:
        with self._changed:
            if job_id not in self._submitted:
                return  # already answered: the cancel crossed its result
            if self._planner.remove(job_id) is None:
                self._cancelled.add(job_id)  # still to be prepared
            self._submitted.discard(job_id)

    def start(self) -> None:
        """Report the checkpoints the engine loaded at create, then run the prepare thread and
        every compute thread in the background."""
        self._report_loads()
        self._threads = [threading.Thread(target=self.prepare_jobs, name="prepare", daemon=True)]
        self._threads += [
            threading.Thread(
                target=self.compute, args=(thread,), name=f"compute-{thread}", daemon=True
            )
            for thread in range(self._passes)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """End the threads `start` began once their current pass is done."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._incoming.put(None)

    def close(self) -> None:
        """Withdraw every job not yet answered, stop, and wait for the threads to end (each
        finishes the pass it is running), so nothing refers to the engine any more."""
        with self._changed:
            for job_id in self._submitted:
                if self._planner.remove(job_id) is None:
                    self._cancelled.add(job_id)  # still to be prepared: dropped there
            self._submitted.clear()
        self.stop()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def prepare_jobs(self) -> None:
        while (submit := self._incoming.get()) is not None:
            with self._changed:
                if submit.id in self._cancelled:
                    self._cancelled.discard(submit.id)
                    continue
            try:
                prepared = self._engine.prepare(submit.job)
                limit = self._job_token_limit
                if limit and prepared.input_tokens > limit:
                    raise over_token_limit(prepared.input_tokens, limit)
            except Exception as exc:
                self._report_loads()
                self._fail(submit.id, exc)
                continue
            self._report_loads()  # a checkpoint loaded on first use: before any of its answers
            with self._changed:
                if submit.id in self._cancelled:
                    self._cancelled.discard(submit.id)
                    continue
                task = self._planner.add(submit.id, prepared)
                if not prepared.rows:
                    self._planner.remove(submit.id)
                self._changed.notify()
            if not prepared.rows:
                self._finish(task)

    def _report_loads(self) -> None:
        if self._loads is not None:
            for load in self._loads():
                linears = load.linears
                counts = linears.linear_layers, linears.int8_layers
                kept = list(linears.kept)
                self._emit(
                    Loaded(
                        load.checkpoint,
                        load.path,
                        load.precision,
                        *counts,
                        kept,
                        load.requested,
                        load.reason,
                        load.probe_fallback,
                    )
                )

    def compute(self, thread: int) -> None:
        """One compute thread's loop; `passes` of them share the planner."""
        while True:
            with self._changed:
                while not (turn := self._planner.take()):
                    if self._stopped:
                        return
                    self._changed.wait()
                self._computing += 1
                if self._planner.has_rows:
                    self._changed.notify()  # what this turn left, for an idle thread
            for each in turn:
                self._run(thread, each)
            with self._changed:
                self._computing -= 1
                idle = not self._computing and not self._planner.has_rows
            if idle:  # the last pass of a round: its temporaries' pages go back (`trim`)
                trim()

    def _run(self, thread: int, each: PlannedPass) -> None:
        """One forward pass; a failing pass of several jobs is rerun job by job, so an error
        reaches only the job that caused it."""
        with self._changed:
            rows = [(task, index) for task, index in each.rows if self._planner.live(task)]
        if not rows:
            return
        each = PlannedPass(each.group, rows)
        self._emit(PassBegun(thread))
        started, clock = time.time(), time.perf_counter()
        try:
            outputs = self._engine.forward(
                each.group, [task.prepared.rows[index] for task, index in rows]
            )
            if len(outputs) != len(rows):
                raise RuntimeError("engine returned a different number of outputs")
        except Exception as exc:
            self._emit(PassDone(thread, [], 0, 0, started, time.perf_counter() - clock))
            tasks = each.tasks
            if len(tasks) == 1:
                self._withdraw(tasks[0], exc)
            else:
                for task in tasks:
                    self._run(thread, PlannedPass(each.group, [r for r in rows if r[0] is task]))
            return
        seconds = time.perf_counter() - clock
        tasks = each.tasks
        self._emit(
            PassDone(thread, [t.id for t in tasks], len(rows), each.padded_tokens, started, seconds)
        )
        finished: list[PlannedJob] = []
        with self._changed:
            for (task, index), output in zip(rows, outputs, strict=True):
                task.outputs[index] = output
                task.running -= 1
            for task in tasks:
                if task.complete and self._planner.remove(task.id) is task:
                    finished.append(task)
        for task in finished:
            self._finish(task)

    def _withdraw(self, task: PlannedJob, exc: Exception) -> None:
        """Fail a job whose pass failed alone; its other rows are withdrawn."""
        with self._changed:
            live = self._planner.remove(task.id) is task
        if live:
            self._fail(task.id, exc)

    def _finish(self, task: PlannedJob) -> None:
        try:
            decision = self._engine.finish(task.prepared, task.outputs)
        except Exception as exc:
            self._fail(task.id, exc)
            return
        self._send(task.id, Result(task.id, decision))

    def _fail(self, job_id: int, exc: Exception) -> None:
        if isinstance(exc, RequestInvalid):
            frame: FromWorker = Rejected(job_id, exc.issues)
        else:
            log.error("job %d failed: %s", job_id, describe(exc))
            frame = JobFailed(job_id, type(exc).__name__)
        self._send(job_id, frame)

    def _send(self, job_id: int, frame: FromWorker) -> None:
        """Write a job's answer, unless it was cancelled; one that msgpack cannot carry fails
        the job instead."""
        with self._changed:
            if job_id not in self._submitted:
                return
            self._submitted.discard(job_id)
        try:
            self._emit(frame)
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
            log.error("job %d answer cannot be sent: %s", job_id, describe(exc))
            self._emit(JobFailed(job_id, type(exc).__name__))
