"""The gateway side of a local provider: its worker subprocess, started on demand.

`WorkerRuntime` is what residency loads and unloads: loading starts `python -m
providers.worker` and waits for its `Ready` frame; unloading ends the process, so the memory
of torch and the checkpoint returns to the system. Jobs go to the worker as frames and come
back by id, so any number of requests can be in flight at once and the worker batches them.

A worker that exits, sends garbage, or makes no progress for
`DECIDEALOT_PROVIDER_TIMEOUT_SECONDS` while jobs are in flight (no answer to any of them:
its current pass has hung or overrun) is killed; every job in flight on it fails with
`ProviderUnavailable` and `loaded` turns False, so the next request starts a new worker.
Workers never outlive the gateway: they end when their stdin closes, and the kernel kills
them when the gateway dies (`PR_SET_PDEATHSIG`, which fires when the thread that started the
worker exits, i.e. when the event loop's thread does).

The gateway never imports torch: `resolve_device` decides `auto` from the NVIDIA driver's
files and, only where they exist, asks a short subprocess of the worker's interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import logging
import os
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from decidealot import logs, metrics, tracing
from decidealot.config import Settings
from decidealot.errors import DecisionInputError, ProviderUnavailable
from providers.engine import Decision, EngineSpec, Job
from providers.frames import (
    Failed,
    FrameError,
    InputError,
    JobFailed,
    Pass,
    Ready,
    Result,
    Start,
    Submit,
    decode_from_worker,
    encode,
    read_payload_async,
)

if TYPE_CHECKING:
    from decidealot.residency import Residency

log = logging.getLogger("decidealot.worker")

START_FAILED = "the local provider could not start"
STOPPED = "the local provider stopped before answering"
TIMED_OUT = "the local provider timed out"
NOT_LOADED = "the local provider is not loaded"
FAILED_JOB = "the local provider failed to answer"

EXIT_GRACE_SECONDS = 5.0
"""How long an unloaded worker may take to exit after its stdin closes before it is killed."""

_STDERR_LINE_LIMIT = 1 << 20
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
_NVIDIA_DRIVER_FILES = (Path("/proc/driver/nvidia/version"), Path("/dev/nvidiactl"))
_CUDA_PROBE = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
_CUDA_PROBE_TIMEOUT_SECONDS = 120.0


CPU_TOKEN_BUDGET = 4096
CUDA_TOKEN_BUDGET = 32768


def token_budget(settings: Settings, device: str) -> int:
    """Padded tokens per engine run. On CPU a pass costs the same per token at any batch size,
    so big batches only delay every answer in them (and risk the pass timeout): small ones keep
    answers flowing while the next batch forms. On CUDA large batches are what pays."""
    if settings.batch_token_budget:
        return settings.batch_token_budget
    return CUDA_TOKEN_BUDGET if device == "cuda" else CPU_TOKEN_BUDGET


def concurrent_passes(settings: Settings, device: str) -> int:
    """Forward passes a worker runs at once. On CUDA one: the device is the serial lane. On
    CPU a pass costs the same per token at any batch size, so cores, not batches, are what
    pays: as many passes as `DECIDEALOT_TORCH_THREADS`-thread passes fit on the usable cores
    (torch's default uses every core, so one)."""
    if settings.worker_passes:
        return settings.worker_passes
    if device == "cuda":
        return 1
    cores = _usable_cores()
    threads = settings.torch_threads or cores
    return max(1, cores // threads)


def _usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def lane_for(name: str, device: str, settings: Settings) -> tuple[str | None, str]:
    """The residency lane and group of a local provider (see `decidealot.residency`).

    On CUDA every provider is its own group on lane "cuda": one provider's passes at a time on
    the device. On CPU, Laya and Von share group "models" on lane "local", so with two slots
    they overlap, while CLM (encoder calls included) is group "clm" and overlaps neither, as
    the contract asks, unless DECIDEALOT_CLM_PARALLEL_WITH_LOCAL_MODELS frees it of any lane.
    """
    if name == "clm" and settings.clm_parallel_with_local_models:
        return None, name
    if device == "cuda":
        return "cuda", name
    return "local", "clm" if name == "clm" else "models"


def resolve_device(settings: Settings) -> str:
    """`cpu` or `cuda` for `DECIDEALOT_DEVICE`; `auto` is cuda when torch can use a GPU.

    Without NVIDIA driver files `auto` is cpu at no cost; with them, one subprocess of the
    worker's interpreter imports torch and asks (once per process and interpreter).
    """
    if settings.device != "auto":
        return settings.device
    return _probe_cuda(settings.worker_python or sys.executable)


@functools.cache
def _probe_cuda(python: str) -> str:
    if not any(path.exists() for path in _NVIDIA_DRIVER_FILES):
        return "cpu"
    try:
        probe = subprocess.run(
            [python, "-c", _CUDA_PROBE],
            capture_output=True,
            text=True,
            timeout=_CUDA_PROBE_TIMEOUT_SECONDS,
            env=_worker_environment(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not ask torch whether CUDA is available (%s); using cpu", exc)
        return "cpu"
    device = "cuda" if probe.stdout.strip() == "cuda" else "cpu"
    log.info("DECIDEALOT_DEVICE=auto resolved to %s", device)
    return device


def _worker_environment() -> dict[str, str]:
    """The gateway's environment without DECIDEALOT_* values (keys among them); the project
    on the path so `providers.worker` and engine factories import from any directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _PROJECT_ROOT + (os.pathsep + path if path else "")
    return env


def _background(work: Coroutine[object, object, None]) -> asyncio.Task[None]:
    """A task for the worker's lifetime, outside the context of the request that started it,
    so its log lines do not carry that request's id."""
    return asyncio.create_task(work, context=contextvars.Context())


class _Worker:
    """One worker process and the jobs in flight on it; discarded once it stops."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.inflight: dict[int, asyncio.Future[Decision]] = {}
        self.request_ids: dict[int, str] = {}
        """The request id each job in flight came with, for its failure's log line."""
        self.spans: dict[int, tracing.SpanContext | None] = {}
        """The span each job in flight was submitted under, to parent its forward pass."""
        self.alive = True
        self.progress_at = asyncio.get_running_loop().time()
        self.write_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task[None]] = []

    def abandon(self, message: str) -> None:
        """Fail every job in flight and kill the process; its reader task reaps it."""
        self.alive = False
        for future in self.inflight.values():
            if not future.done():
                future.set_exception(ProviderUnavailable(message))
        self.inflight.clear()
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


class WorkerRuntime:
    """A local provider's worker process (`providers.base.LocalRuntime`) and its job channel.

    The runtime applies `DECIDEALOT_DEVICE` and `DECIDEALOT_TORCH_THREADS` to the spec it is
    given, so every local provider honours them the same way.
    """

    def __init__(self, name: str, spec: EngineSpec, settings: Settings) -> None:
        self.name = name
        self.device = resolve_device(settings)
        self._spec = msgspec.structs.replace(
            spec, device=self.device, torch_threads=settings.torch_threads
        )
        self._settings = settings
        self._python = settings.worker_python or sys.executable
        self._worker: _Worker | None = None
        self._lifecycle = asyncio.Lock()
        self._job_ids = itertools.count(1)
        self._log = log.getChild(name)
        self._lost = False
        """A worker died, hung or sent garbage; the next start is a restart."""

    @property
    def loaded(self) -> bool:
        return self._worker is not None and self._worker.alive

    @property
    def pid(self) -> int | None:
        """The worker's process id while it is loaded."""
        worker = self._worker
        return worker.process.pid if worker is not None and worker.alive else None

    async def load(self) -> None:
        async with self._lifecycle:
            if not self.loaded:
                self._worker = await self._start()

    async def unload(self) -> None:
        async with self._lifecycle:
            worker, self._worker = self._worker, None
            if worker is not None:
                await self._stop(worker)

    async def submit(self, job: Job) -> Decision:
        """Run one job on the loaded worker, batched with whatever else is in flight.

        Raises `DecisionInputError` for input the engine rejects and `ProviderUnavailable`
        when the worker is not loaded, dies, hangs or fails on this job.
        """
        worker = self._worker
        if worker is None or not worker.alive:
            raise ProviderUnavailable(NOT_LOADED)
        job_id = next(self._job_ids)
        try:
            frame = encode(Submit(job_id, job))
        except OverflowError:  # msgpack holds 64-bit integers; JSON input may hold larger
            self._log.error("a job holds an integer beyond 64 bits; not sent")
            raise ProviderUnavailable(FAILED_JOB) from None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Decision] = loop.create_future()
        if not worker.inflight:
            worker.progress_at = loop.time()  # the timeout counts from here when it was idle
        worker.inflight[job_id] = future
        worker.request_ids[job_id] = logs.request_id.get()
        worker.spans[job_id] = tracing.current()
        try:
            async with worker.write_lock:
                worker.process.stdin.write(frame)  # type: ignore[union-attr]
                await worker.process.stdin.drain()  # type: ignore[union-attr]
        except ConnectionError:
            pass  # the worker is gone; its reader task fails the future
        try:
            return await self._answer(worker, future)
        finally:
            worker.inflight.pop(job_id, None)
            worker.request_ids.pop(job_id, None)
            worker.spans.pop(job_id, None)

    async def _answer(self, worker: _Worker, future: asyncio.Future[Decision]) -> Decision:
        """Wait for the job's frame, killing the worker if it stops making progress."""
        timeout = self._settings.provider_timeout_seconds
        loop = asyncio.get_running_loop()
        while not future.done():
            remaining = worker.progress_at + timeout - loop.time()
            if remaining <= 0:
                self._log.error(
                    "worker answered nothing for %.1f s; killing it (pid %d)",
                    timeout,
                    worker.process.pid,
                )
                self._forget(worker)
                self._lose("timeout")
                worker.abandon(TIMED_OUT)
                break
            await asyncio.wait({future}, timeout=remaining)
        return future.result()

    # -- process lifecycle -----------------------------------------------------------------

    async def _start(self) -> _Worker:
        try:
            process = await asyncio.create_subprocess_exec(
                self._python,
                "-m",
                "providers.worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=_worker_environment(),
                limit=_STDERR_LINE_LIMIT,
            )
        except OSError as exc:
            self._log.error("cannot start a worker with %s (%s)", self._python, exc.strerror)
            metrics.WORKER_FAILURES.inc(provider=self.name, reason="start_failed")
            raise ProviderUnavailable(START_FAILED) from None
        worker = _Worker(process)
        worker.tasks.append(_background(self._forward_stderr(process)))
        self._log.info("starting worker (pid %d) on %s", process.pid, self.device)
        try:
            ready = await asyncio.wait_for(
                self._handshake(process), self._settings.provider_start_timeout_seconds
            )
        except TimeoutError:
            self._log.error(
                "worker not ready within %g s; killing it",
                self._settings.provider_start_timeout_seconds,
            )
            ready = None
        except BaseException:
            await self._stop(worker, kill=True)
            raise
        if not isinstance(ready, Ready):
            if isinstance(ready, Failed):
                self._log.error("worker failed to start (%s)", ready.error)
            metrics.WORKER_FAILURES.inc(provider=self.name, reason="start_failed")
            await self._stop(worker, kill=True)
            raise ProviderUnavailable(START_FAILED)
        self._log.info("worker ready (pid %d, %s)", process.pid, ready.device)
        metrics.WORKER_STARTS.inc(provider=self.name)
        if self._lost:
            self._lost = False
            metrics.WORKER_RESTARTS.inc(provider=self.name)
        worker.tasks.append(_background(self._read_answers(worker)))
        return worker

    async def _handshake(self, process: asyncio.subprocess.Process) -> Ready | Failed | None:
        """Send the start frame and read the worker's first answer; None if it went away."""
        start = Start(
            self._spec,
            token_budget(self._settings, self.device),
            report_passes=True,
            concurrent_passes=concurrent_passes(self._settings, self.device),
        )
        try:
            process.stdin.write(encode(start))  # type: ignore[union-attr]
            await process.stdin.drain()  # type: ignore[union-attr]
            payload = await read_payload_async(process.stdout)  # type: ignore[arg-type]
            frame = None if payload is None else decode_from_worker(payload)
        except ConnectionError:
            return None
        except FrameError as exc:
            self._log.error("worker sent a malformed frame (%s)", exc)
            return None
        if frame is None:
            self._log.error("worker exited before it was ready")
        elif not isinstance(frame, Ready | Failed):
            self._log.error("worker sent %s before it was ready", type(frame).__name__)
            return None
        return frame

    async def _stop(self, worker: _Worker, *, kill: bool = False) -> None:
        """End the process: stdin closes (a ready worker exits by itself), then a kill after
        a grace; at once with `kill`, for a worker that never became ready."""
        worker.alive = False
        for future in worker.inflight.values():
            if not future.done():
                future.set_exception(ProviderUnavailable(STOPPED))
        worker.inflight.clear()
        process = worker.process
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        if kill and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        try:
            await asyncio.wait_for(process.wait(), EXIT_GRACE_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        finally:
            await asyncio.gather(*worker.tasks, return_exceptions=True)
        self._log.info("worker stopped (pid %d)", process.pid)

    def _forget(self, worker: _Worker) -> None:
        if self._worker is worker:
            self._worker = None

    def _lose(self, reason: str) -> None:
        """Count a worker lost while loaded; its replacement will count as a restart."""
        self._lost = True
        metrics.WORKER_FAILURES.inc(provider=self.name, reason=reason)

    async def _read_answers(self, worker: _Worker) -> None:
        """Deliver each answer frame to its job's future until the worker's stdout ends."""
        stdout = worker.process.stdout
        assert stdout is not None
        loop = asyncio.get_running_loop()
        malformed = False
        try:
            while (payload := await read_payload_async(stdout)) is not None:
                frame = decode_from_worker(payload)
                worker.progress_at = loop.time()
                if isinstance(frame, Pass):
                    metrics.FORWARD_PASS.observe(frame.seconds, provider=self.name)
                    metrics.BATCH_SIZE.observe(frame.size, provider=self.name)
                    metrics.BATCH_TOKENS.observe(frame.tokens, provider=self.name)
                    for job_id in frame.ids:
                        tracing.record(
                            "forward_pass",
                            worker.spans.get(job_id),
                            frame.started,
                            frame.started + frame.seconds,
                            provider=self.name,
                            jobs=frame.size,
                            tokens=frame.tokens,
                        )
                    continue
                if not isinstance(frame, Result | InputError | JobFailed):
                    raise FrameError(f"unexpected {type(frame).__name__} frame")
                future = worker.inflight.pop(frame.id, None)
                if future is None or future.done():
                    continue  # its caller gave up waiting
                if isinstance(frame, Result):
                    future.set_result(frame.decision)
                elif isinstance(frame, InputError):
                    future.set_exception(
                        DecisionInputError(frame.question, frame.msg, frame.loc, frame.input)
                    )
                else:
                    token = logs.request_id.set(worker.request_ids.get(frame.id, "-"))
                    self._log.error("worker failed job %d (%s)", frame.id, frame.error)
                    logs.request_id.reset(token)
                    future.set_exception(ProviderUnavailable(FAILED_JOB))
        except FrameError as exc:
            self._log.error("worker sent a malformed frame (%s); killing it", exc)
            malformed = True
        unexpected = worker.alive
        if unexpected:
            self._forget(worker)
            self._lose("malformed" if malformed else "exited")
            worker.abandon(STOPPED)
        code = await worker.process.wait()
        if unexpected:
            self._log.error(
                "worker exited unexpectedly (pid %d, code %d)", worker.process.pid, code
            )

    async def _forward_stderr(self, process: asyncio.subprocess.Process) -> None:
        """The worker's stderr into the gateway's log, a line per record; lines that start
        with a level name take it, continuation lines (tracebacks) keep the previous one."""
        stderr = process.stderr
        assert stderr is not None
        level = logging.WARNING
        while True:
            try:
                line = await stderr.readline()
            except ValueError:
                self._log.warning("worker wrote an overlong stderr line; dropped")
                continue
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            if not text:
                continue
            named = logging.getLevelName(text.split(" ", 1)[0])
            if isinstance(named, int):
                level = named
            self._log.log(level, "%s", text)


class ResidentRunner:
    """Runs jobs on a runtime inside its residency slot and lane (`providers.base.JobRunner`)."""

    def __init__(self, runtime: WorkerRuntime, residency: Residency) -> None:
        self._runtime = runtime
        self._residency = residency

    async def run(self, job: Job) -> Decision:
        async with self._residency.use(self._runtime):
            return await self._runtime.submit(job)
