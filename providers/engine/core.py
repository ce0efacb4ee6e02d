"""`EngineCore`: one engine's jobs, from their arrival to their answers, with no I/O (every
message goes to `emit`).

The prepare thread runs `engine.prepare` while passes run, and refuses a job over the token
limit before any of its rows reaches a pass. Each compute thread takes the planner's next turn
and runs its passes: there is no wait for a batch to fill, and several threads let one-thread
CPU passes use every core (rows are independent: a job's answer is the same whichever rows and
thread ran it). A failing pass of several jobs is rerun job by job, so an error reaches only the
job that caused it; a cancelled job's rows not yet in a pass are withdrawn. An engine whose
passes compile (`CompilesPasses`) gets a compile thread, which compiles them while no job is
held or running (or after `COMPILE_PATIENCE` of steady load): eager passes serve meanwhile. Log
lines name exception types and places, never messages: those may quote the state.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

import msgspec

from decidealot.errors import RequestInvalid, over_token_limit
from decidealot.jobs import Job
from decidealot.providers.engine.planner import PlannedJob, PlannedPass, Planner
from decidealot.providers.engine.protocol import (
    CompilesPasses,
    Engine,
    FromWorker,
    Heartbeat,
    JobFailed,
    PassDone,
    Rejected,
    Result,
)
from decidealot.providers.worker.memory import trim

log = logging.getLogger("decidealot.worker")

COMPILE_PATIENCE = 30.0
"""Seconds the compile thread waits for the passes to fall idle before it compiles anyway."""


def describe(exc: BaseException) -> str:
    """An exception's type and where it was raised, without its message."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__} at {where}" if where else type(exc).__name__


class EngineCore:
    def __init__(
        self,
        engine: Engine,
        emit: Callable[[FromWorker], None],
        token_budget: int,
        compute_threads: int = 1,
        job_token_limit: int = 0,
    ) -> None:
        self._engine = engine
        self._emit = emit
        self._compute_threads = compute_threads
        self._job_token_limit = job_token_limit
        self._incoming: queue.SimpleQueue[tuple[int, Job] | None] = queue.SimpleQueue()
        self._changed = threading.Condition()  # guards everything below
        self._planner = Planner(token_budget, engine.shape)
        self._stopped = False
        self._computing = 0  # compute threads running a turn
        # what runs and since when (`time.monotonic`), for heartbeats
        self._passes: dict[int, float] = {}
        self._preparing: float | None = None
        self._moved = time.monotonic()
        """When a job last arrived at an empty core, or a pass or prepare last began or ended."""
        self._threads: list[threading.Thread] = []
        self._compile_due = threading.Event()  # set when a job was prepared: it may have loaded

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._prepare_jobs, name="prepare", daemon=True)]
        self._threads += [
            threading.Thread(target=self._compute, args=(n,), name=f"compute-{n}", daemon=True)
            for n in range(self._compute_threads)
        ]
        for thread in self._threads:
            thread.start()
        if isinstance(self._engine, CompilesPasses):
            # not joined at `close`: a compile under way cannot be cut short
            threading.Thread(target=self._compile, name="compile", daemon=True).start()
            self._compile_due.set()  # preloaded checkpoints

    def submit(self, job_id: int, job: Job) -> None:
        with self._changed:
            if not self._planner:
                self._moved = time.monotonic()
            self._planner.receive(job_id)
        self._incoming.put((job_id, job))

    def cancel(self, job_id: int) -> None:
        """The job's caller has gone: no answer is sent (one already sent crossed the cancel)."""
        with self._changed:
            self._planner.remove(job_id)

    def heartbeat(self) -> Heartbeat | None:
        """None while the core holds nothing and runs nothing."""
        with self._changed:
            if not self._planner and not self._passes and self._preparing is None:
                return None
            now = time.monotonic()
            passes = {thread: now - began for thread, began in self._passes.items()}
            preparing = 0.0 if self._preparing is None else now - self._preparing
            quiet = bool(self._planner) and not passes and self._preparing is None
        return Heartbeat(passes, preparing, now - self._moved if quiet else 0.0)

    def stop(self) -> None:
        """The threads end once their current pass is done."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._incoming.put(None)
        self._compile_due.set()

    def close(self) -> None:
        """Drop every job, stop, and wait for the threads: then nothing refers to the engine
        but a compile under way, which ends on its own."""
        with self._changed:
            self._planner.clear()
        self.stop()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _prepare_jobs(self) -> None:
        while (item := self._incoming.get()) is not None:
            job_id, job = item
            with self._changed:
                if job_id not in self._planner:
                    continue  # cancelled before its turn to be prepared
                self._preparing = self._moved = time.monotonic()
            try:
                prepared = self._engine.prepare(job)
                limit = self._job_token_limit
                if limit and prepared.input_tokens > limit:
                    raise over_token_limit(prepared.input_tokens, limit)
            except Exception as exc:
                with self._changed:
                    self._preparing, self._moved = None, time.monotonic()
                    held = self._planner.remove(job_id)
                if held:
                    self._fail(job_id, exc)
                continue
            self._compile_due.set()
            with self._changed:
                self._preparing, self._moved = None, time.monotonic()
                if job_id not in self._planner:
                    continue
                planned = self._planner.add(job_id, prepared)
                if prepared.rows:
                    self._changed.notify()
                    continue
                self._planner.remove(job_id)
            self._finish(planned)

    def _compile(self) -> None:
        """Compiles what the engine has to compile once the core is idle, after each prepare
        (which may have loaded a checkpoint); a compile under way at `stop` runs to its end."""
        engine = cast(CompilesPasses, self._engine)
        while True:
            self._compile_due.wait()
            self._compile_due.clear()
            since = time.monotonic()
            while True:
                with self._changed:
                    if self._stopped:
                        return
                    idle = not self._planner and not self._passes and self._preparing is None
                if idle or time.monotonic() - since > COMPILE_PATIENCE:
                    break
                time.sleep(0.05)
            try:
                while not self._stopped and engine.compile_next():
                    pass
            except Exception as exc:  # the engine's own failures are its to report
                log.error("compiling passes failed: %s", describe(exc))

    def _compute(self, thread: int) -> None:
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
        with self._changed:
            rows = [(job, index) for job, index in each.rows if self._planner.live(job)]
            if not rows:
                return
            self._passes[thread] = self._moved = time.monotonic()
        each = PlannedPass(each.group, rows)
        started, clock = time.time(), time.perf_counter()
        try:
            outputs = self._engine.forward(each.group, [job.prepared.rows[i] for job, i in rows])
            if len(outputs) != len(rows):
                raise RuntimeError("engine returned a different number of outputs")
        except Exception as exc:
            self._ended(thread)
            self._emit(PassDone(thread, [], 0, 0, started, time.perf_counter() - clock))
            jobs = each.jobs
            if len(jobs) == 1:
                with self._changed:
                    held = self._planner.remove(jobs[0].id)
                if held:
                    self._fail(jobs[0].id, exc)
            else:
                for job in jobs:
                    self._run(thread, PlannedPass(each.group, [r for r in rows if r[0] is job]))
            return
        seconds = time.perf_counter() - clock
        self._ended(thread)
        jobs = each.jobs
        self._emit(
            PassDone(thread, [j.id for j in jobs], len(rows), each.padded_tokens, started, seconds)
        )
        finished: list[PlannedJob] = []
        with self._changed:
            for (job, index), output in zip(rows, outputs, strict=True):
                job.outputs[index] = output
                job.running -= 1
            for job in jobs:
                if job.complete and self._planner.live(job) and self._planner.remove(job.id):
                    finished.append(job)
        for job in finished:
            self._finish(job)

    def _ended(self, thread: int) -> None:
        with self._changed:
            self._passes.pop(thread, None)
            self._moved = time.monotonic()

    def _finish(self, job: PlannedJob) -> None:
        try:
            decision = self._engine.finish(job.prepared, job.outputs)
        except Exception as exc:
            self._fail(job.id, exc)
            return
        self._send(job.id, Result(job.id, decision))

    def _fail(self, job_id: int, exc: Exception) -> None:
        if isinstance(exc, RequestInvalid):
            frame: FromWorker = Rejected(job_id, exc.issues)
        else:
            log.error("job %d failed: %s", job_id, describe(exc))
            frame = JobFailed(job_id, type(exc).__name__)
        self._send(job_id, frame)

    def _send(self, job_id: int, frame: FromWorker) -> None:
        """An answer msgpack cannot carry fails the job instead."""
        try:
            self._emit(frame)
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
            log.error("job %d answer cannot be sent: %s", job_id, describe(exc))
            self._emit(JobFailed(job_id, type(exc).__name__))
