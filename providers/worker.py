"""The subprocess host of one local provider's engine: `python -m providers.worker`.

Torch, transformers and checkpoints live only in this process, so unloading a provider is
ending it. The gateway sends a `Start` frame, then `Submit` frames on stdin; answers go back
as frames on stdout, which nothing else may write to (stray prints land on stderr, which the
gateway forwards to its log). Threads:

- reader: receives jobs; at end of stdin (the gateway closed it or died) ends the process;
- prepare: runs `engine.prepare` (tokenisation) while the current passes run;
- compute (main, plus `Start.concurrent_passes - 1` more): each takes whatever prepared jobs
  are queued — one group, FIFO, within the token budget — and runs them as one `engine.run`.
  There is no wait for a batch to fill: a batch is whatever queued while the previous pass
  ran. Several compute threads let one-thread CPU passes use every core (on CPU a pass costs
  the same per token at any batch size, so more cores, not bigger batches, is what pays);
  jobs are independent, so each job's answer is the same whichever thread runs it.

A failing multi-job batch is rerun one job at a time, so an error reaches only the job that
caused it and every answer is what that job would get alone. Log lines name exception types
and code locations, never exception messages: those may quote the state.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

import msgspec

from decidealot.errors import DecisionInputError
from providers.engine import Engine, EngineSpec, Prepared
from providers.frames import (
    Failed,
    FrameError,
    FromWorker,
    InputError,
    JobFailed,
    Pass,
    Ready,
    Result,
    Start,
    Submit,
    decode_to_worker,
    encode,
    read_payload,
)

_PR_SET_PDEATHSIG = 1

log = logging.getLogger("providers.worker")


class Pending(NamedTuple):
    id: int
    prepared: Prepared


def take_batch(pending: deque[Pending], token_budget: int) -> list[Pending]:
    """Remove and return the next batch: the oldest job, then later jobs of its group in
    order while their summed cost fits the budget. The first job always goes, whatever its
    cost; once one job does not fit, none after it in the group is taken (FIFO)."""
    group = pending[0].prepared.group
    batch: list[Pending] = []
    left: deque[Pending] = deque()
    cost = 0
    full = False
    for item in pending:
        if full or item.prepared.group != group:
            left.append(item)
        elif batch and cost + item.prepared.cost > token_budget:
            full = True
            left.append(item)
        else:
            batch.append(item)
            cost += item.prepared.cost
    pending.clear()
    pending.extend(left)
    return batch


def describe(exc: BaseException) -> str:
    """An exception's type and where it was raised, without its message."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__} at {where}" if where else type(exc).__name__


class FrameWriter:
    """Serialises frame writes from the prepare and compute threads."""

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
    """Runs one engine's jobs: prepares them on one thread, batches and runs them on
    `passes` compute threads."""

    def __init__(
        self,
        engine: Engine,
        writer: FrameWriter,
        token_budget: int,
        report_passes: bool = False,
        passes: int = 1,
    ) -> None:
        self._engine = engine
        self._writer = writer
        self._token_budget = token_budget
        self._report_passes = report_passes
        self._passes = passes
        self._incoming: queue.SimpleQueue[Submit] = queue.SimpleQueue()
        self._pending: deque[Pending] = deque()
        self._pending_changed = threading.Condition()

    def read_jobs(self, stream: BinaryIO) -> None:
        while True:
            try:
                payload = read_payload(stream)
                frame = None if payload is None else decode_to_worker(payload)
            except FrameError:
                log.error("malformed frame from the gateway; exiting")
                os._exit(2)
            if frame is None:
                os._exit(0)  # stdin closed: unloaded, or the gateway died
            if isinstance(frame, Submit):
                self._incoming.put(frame)
            else:
                log.error("unexpected %s frame; ignored", type(frame).__name__)

    def prepare_jobs(self) -> None:
        while True:
            submit = self._incoming.get()
            try:
                prepared = self._engine.prepare(submit.job)
            except Exception as exc:
                self._fail(submit.id, exc)
                continue
            with self._pending_changed:
                self._pending.append(Pending(submit.id, prepared))
                self._pending_changed.notify()

    def compute(self) -> None:
        """One compute thread's loop; `passes` of them share the pending queue."""
        while True:
            with self._pending_changed:
                while not self._pending:
                    self._pending_changed.wait()
                batch = take_batch(self._pending, self._token_budget)
                if self._pending:
                    self._pending_changed.notify()  # what this batch left, for an idle thread
            self._run(batch)

    def serve(self) -> None:
        """Run the compute loops: `passes - 1` threads, and this one."""
        for index in range(1, self._passes):
            threading.Thread(target=self.compute, name=f"compute-{index}", daemon=True).start()
        self.compute()

    def _run(self, batch: Sequence[Pending]) -> None:
        started = time.perf_counter()
        wall_started = time.time()
        try:
            decisions = self._engine.run([item.prepared for item in batch])
            if len(decisions) != len(batch):
                raise RuntimeError("engine returned a different number of decisions")
        except Exception as exc:
            if len(batch) == 1:
                self._fail(batch[0].id, exc)
            else:
                for item in batch:
                    self._run([item])
            return
        if self._report_passes:
            tokens = int(sum(item.prepared.cost for item in batch))
            seconds = time.perf_counter() - started
            ids = [item.id for item in batch]
            self._writer.write(Pass(len(batch), tokens, seconds, ids, wall_started))
        for item, decision in zip(batch, decisions, strict=True):
            self._send(item.id, Result(item.id, decision))

    def _fail(self, job_id: int, exc: Exception) -> None:
        if isinstance(exc, DecisionInputError):
            frame: FromWorker = InputError(job_id, exc.question, exc.msg, exc.loc, exc.input)
        else:
            log.error("job %d failed: %s", job_id, describe(exc))
            frame = JobFailed(job_id, type(exc).__name__)
        self._send(job_id, frame)

    def _send(self, job_id: int, frame: FromWorker) -> None:
        """Write a job's answer; one that msgpack cannot carry fails the job instead."""
        try:
            self._writer.write(frame)
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
            log.error("job %d answer cannot be sent: %s", job_id, describe(exc))
            self._writer.write(JobFailed(job_id, type(exc).__name__))


def build_engine(spec: EngineSpec) -> Engine:
    """Import `spec.factory` and call it with the spec, with torch's thread count applied."""
    if spec.torch_threads > 0:
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(spec.torch_threads)
    module_name, _, function_name = spec.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), function_name)
    if spec.torch_threads > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(spec.torch_threads)
    engine: Engine = factory(spec)
    return engine


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
    try:
        engine = build_engine(start.spec)
    except Exception as exc:
        log.exception("engine %s failed to start", start.spec.factory)
        writer.write(Failed(type(exc).__name__))
        return 1
    host = Host(
        engine, writer, start.batch_token_budget, start.report_passes, start.concurrent_passes
    )
    writer.write(Ready(start.spec.device))
    threading.Thread(target=host.read_jobs, args=(frames_in,), name="reader", daemon=True).start()
    threading.Thread(target=host.prepare_jobs, name="prepare", daemon=True).start()
    host.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
