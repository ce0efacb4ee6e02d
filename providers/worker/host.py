"""The subprocess host of one local provider's engine: `python -m decidealot.providers.worker`.

Torch and checkpoints live only in this process, so unloading a provider is ending it. The
gateway sends a `Start` frame, then `Submit` frames on stdin; answers go back as frames on
stdout, which nothing else may write to (stray prints land on stderr, which the gateway
forwards to its log). On a model switch the gateway sends `Release` instead of closing stdin:
the engine's threads end, the engine is dropped and its memory returned to the system
(`release_memory`), the worker answers `Released` and builds the next `Start`'s engine, so a
switch costs no new interpreter and no second torch import. Threads:

- reader (main): receives jobs and cancellations; at end of stdin (the gateway closed it or
  died) ends the process;
- prepare: runs `engine.prepare` (tokenisation) while the current passes run, and refuses a
  job over `Start.job_token_limit` before any of its rows reaches a pass;
- compute (`Start.concurrent_passes` of them): each takes the planner's next turn
  (`passes`: rows of concurrent jobs, the job of the fewest turns first, within the token
  budget) and runs its passes, announcing each with `Begin` and reporting it with `Pass`, so
  the gateway times passes, not jobs. There is no wait for a batch to fill: a turn is whatever
  waits when a thread is free. Several compute threads let one-thread CPU passes use every
  core; rows are independent, so each job's answer is the same whichever rows shared its
  passes and whichever thread ran them.

A failing pass of several jobs is rerun job by job, so an error reaches only the job that
caused it. A cancelled job's rows not yet in a pass are withdrawn; those in a pass run on and
are dropped. Log lines name exception types and code locations, never exception messages:
those may quote the state.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

import msgspec

from decidealot.errors import RequestInvalid, over_token_limit
from decidealot.frames import (
    Begin,
    Cancel,
    Failed,
    FrameError,
    FromWorker,
    JobFailed,
    Loaded,
    Ready,
    Rejected,
    Release,
    Released,
    Result,
    Start,
    Submit,
    decode_to_worker,
    encode,
    read_payload,
)
from decidealot.frames import Pass as PassFrame
from decidealot.jobs import Engine, EngineSpec
from decidealot.providers.worker.memory import release_freed, resident_bytes
from decidealot.providers.worker.passes import Pass, Planner, Task

_PR_SET_PDEATHSIG = 1

log = logging.getLogger("decidealot.providers.worker")


def describe(exc: BaseException) -> str:
    """An exception's type and where it was raised, without its message."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__} at {where}" if where else type(exc).__name__


@runtime_checkable
class ReportsLoads(Protocol):
    """An engine that loads checkpoints (at create, or on a job's first use) says which it
    loaded and in what precision: `Loaded` frames, for the gateway's metrics and log."""

    def take_loaded(self) -> list[Loaded]:
        """The checkpoints loaded since the last call."""
        ...


class FrameWriter:
    """Serialises frame writes from the reader, prepare and compute threads."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, frame: FromWorker) -> None:
        """Raises what msgpack raises for a frame it cannot carry; nothing is written then."""
        data = encode(frame)
        try:
            with self._lock:
                self._stream.write(data)
                self._stream.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)  # the gateway is gone: nobody is waiting for answers


class Host:
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
            threading.Thread(target=self.compute, args=(lane,), name=f"compute-{lane}", daemon=True)
            for lane in range(self._passes)
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
            for frame in self._loads():
                self._emit(frame)

    def compute(self, lane: int) -> None:
        """One compute thread's loop; `passes` of them share the planner."""
        while True:
            with self._changed:
                while not (turn := self._planner.take()):
                    if self._stopped:
                        return
                    self._changed.wait()
                if self._planner.has_rows:
                    self._changed.notify()  # what this turn left, for an idle thread
            for each in turn:
                self._run(lane, each)

    def _run(self, lane: int, each: Pass) -> None:
        """One forward pass; a failing pass of several jobs is rerun job by job, so an error
        reaches only the job that caused it."""
        with self._changed:
            rows = [(task, index) for task, index in each.rows if self._planner.live(task)]
        if not rows:
            return
        each = Pass(each.group, rows)
        self._emit(Begin(lane))
        started, clock = time.time(), time.perf_counter()
        try:
            outputs = self._engine.forward(
                each.group, [task.prepared.rows[index] for task, index in rows]
            )
            if len(outputs) != len(rows):
                raise RuntimeError("engine returned a different number of outputs")
        except Exception as exc:
            self._emit(PassFrame(lane, [], 0, 0, started, time.perf_counter() - clock))
            tasks = each.tasks
            if len(tasks) == 1:
                self._withdraw(tasks[0], exc)
            else:
                for task in tasks:
                    self._run(lane, Pass(each.group, [r for r in rows if r[0] is task]))
            return
        seconds = time.perf_counter() - clock
        tasks = each.tasks
        self._emit(
            PassFrame(lane, [t.id for t in tasks], len(rows), each.padded_tokens, started, seconds)
        )
        finished: list[Task] = []
        with self._changed:
            for (task, index), output in zip(rows, outputs, strict=True):
                task.outputs[index] = output
                task.running -= 1
            for task in tasks:
                if task.complete and self._planner.remove(task.id) is task:
                    finished.append(task)
        for task in finished:
            self._finish(task)

    def _withdraw(self, task: Task, exc: Exception) -> None:
        """Fail a job whose pass failed alone; its other rows are withdrawn."""
        with self._changed:
            live = self._planner.remove(task.id) is task
        if live:
            self._fail(task.id, exc)

    def _finish(self, task: Task) -> None:
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


def build_engine(spec: EngineSpec) -> Engine:
    """Import `spec.factory` and call it with the spec, with torch's thread count applied.

    What the imports made is frozen out of the garbage collector's reach (`gc.freeze`): it
    lives as long as the process, and a full collection over torch's objects took 0.4 s of
    every model switch (`release_memory` collects what the engine left)."""
    if spec.torch_threads > 0:
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(spec.torch_threads)
    module_name, _, function_name = spec.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), function_name)
    if spec.torch_threads > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(spec.torch_threads)
    gc.freeze()
    engine: Engine = factory(spec)
    return engine


def release_memory() -> int:
    """Give the memory of the dropped engine back to the system (`memory.release_freed`: a
    freed checkpoint's tensors otherwise stay in the process's arenas); the resident bytes
    after it."""
    release_freed()
    return resident_bytes()


def _die_with_parent() -> None:
    """Second guard after end-of-stdin: the kernel kills this process when the gateway dies.
    (Had it died already, stdin is at its end and the first read ends the process.)"""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _take_std_streams() -> tuple[BinaryIO, BinaryIO]:
    """Private handles on the frame pipes; fds 0 and 1 become /dev/null and stderr."""
    frames_in = os.fdopen(os.dup(0), "rb")
    frames_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (lives as long as the process)
    sys.stdout = sys.stderr
    return frames_in, frames_out


def main() -> int:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the gateway's to handle
    frames_in, frames_out = _take_std_streams()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    writer = FrameWriter(frames_out)
    while True:  # one engine per Start; a Release ends it and the next Start builds another
        try:
            payload = read_payload(frames_in)
            if payload is None:
                return 0
            start = decode_to_worker(payload)
        except FrameError:
            log.error("malformed start frame")
            return 2
        if not isinstance(start, Start):
            log.error("expected a start frame, got %s", type(start).__name__)
            return 2
        code = _serve(start, frames_in, writer)
        if code is not None:
            return code
        writer.write(Released(release_memory()))


def _serve(start: Start, frames_in: BinaryIO, writer: FrameWriter) -> int | None:
    """Build `start`'s engine and run its jobs until a `Release` (None) or a failed build (the
    exit status); the end of stdin ends the process meanwhile. Returns with nothing left that
    refers to the engine, so `release_memory` can return it."""
    try:
        engine = build_engine(start.spec)
    except Exception as exc:
        log.exception("engine %s failed to start", start.spec.factory)
        writer.write(Failed(type(exc).__name__))
        return 1
    host = Host(
        engine,
        writer.write,
        start.batch_token_budget,
        start.concurrent_passes,
        start.job_token_limit,
    )
    del engine
    writer.write(Ready(start.spec.device))
    host.start()
    host.read_jobs(frames_in)  # returns at a Release; ends the process at the end of stdin
    host.close()
    return None
