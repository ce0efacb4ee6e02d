"""The gateway side of a local provider: its worker subprocess, started on demand.

`ProcessRuntime` is what residency loads and unloads: loading starts `python -m
decidealot.providers.worker` and waits for its `Ready` frame; unloading ends the process, so the
memory of torch and the checkpoint returns to the system. A load that replaces another
provider's runtime (a model switch at the slot limit) takes that runtime's worker process over
instead: the worker drops the old engine and returns its memory (`Release` / `Released`), then
builds the new one (`Start`), so a switch pays for the model, not for an interpreter and torch.
Jobs go to the worker as frames and come back by id (`JobChannel`, which the in-process runtime
shares), so any number of requests can be in flight at once and the worker batches them.

The watchdog times forward passes, not jobs: the worker announces each pass (`Begin`) and
reports it (`Pass`), so a request of many passes never trips it. A worker that exits, sends
garbage, runs one pass for longer than `DECIDEALOT_PROVIDER_TIMEOUT_SECONDS`, or sends
nothing at all while jobs wait and no pass runs for as long as a start may take
(`DECIDEALOT_PROVIDER_START_TIMEOUT_SECONDS`: preparing may load a checkpoint), is killed;
every job in flight on it fails with `ProviderUnavailable` and `loaded` turns False, so the
next request starts a new worker. A job whose caller is cancelled (its client hung up) is
withdrawn with a `Cancel` frame: its rows not yet in a pass never run.

Workers never outlive the gateway: they end when their stdin closes, and the kernel kills
them when the gateway dies (`PR_SET_PDEATHSIG`, which fires when the thread that started the
worker exits, i.e. when the event loop's thread does). Device policy (which device, pass
sizes, passes at once, the request token bound) lives in `decidealot.device`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import sys
from collections.abc import Callable, Coroutine

import msgspec

from decidealot import logs, metrics, tracing
from decidealot.config import Settings
from decidealot.device import resolve_device, start_frame, worker_environment
from decidealot.errors import ProviderUnavailable, RequestInvalid
from decidealot.frames import (
    Begin,
    Cancel,
    Failed,
    FrameError,
    FromWorker,
    JobFailed,
    Loaded,
    Pass,
    Ready,
    Rejected,
    Release,
    Released,
    Result,
    Submit,
    decode_from_worker,
    encode,
    read_payload_async,
)
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.protocols import LocalRuntime

log = logging.getLogger("decidealot.worker")

START_FAILED = "the local provider could not start"
FAILED_JOB = "the local provider failed to answer"
STOPPED = "the local provider stopped before answering"
TIMED_OUT = "the local provider timed out"
NOT_LOADED = "the local provider is not loaded"

EXIT_GRACE_SECONDS = 5.0
"""How long an unloaded worker may take to exit after its stdin closes, or a released one to
answer `Released`, before it is killed."""

_STDERR_LINE_LIMIT = 1 << 20


def _background(work: Coroutine[object, object, None]) -> asyncio.Task[None]:
    """A task for the worker's lifetime, outside the context of the request that started it,
    so its log lines do not carry that request's id."""
    return asyncio.create_task(work, context=contextvars.Context())


class JobChannel:
    """One worker's jobs in flight: a future per job id, answered by `deliver`."""

    def __init__(self, provider: str, log: logging.Logger) -> None:
        self._provider = provider
        self._log = log
        self.inflight: dict[int, asyncio.Future[Decision]] = {}
        self._request_ids: dict[int, str] = {}
        """The request id each job came with, for its failure's log line."""
        self._spans: dict[int, tracing.SpanContext | None] = {}
        """The span each job was submitted under, to parent its forward passes."""
        self.heard_at = asyncio.get_running_loop().time()
        """When the worker last sent a frame, or when jobs started waiting on an idle one."""
        self.passes: dict[int, float] = {}
        """Compute lane -> when its running pass began."""

    def open(self, job_id: int) -> asyncio.Future[Decision]:
        """The future `deliver` answers job `job_id` on; the caller `close`s it."""
        loop = asyncio.get_running_loop()
        if not self.inflight:
            self.heard_at = loop.time()  # silence counts from here when it was idle
        future: asyncio.Future[Decision] = loop.create_future()
        self.inflight[job_id] = future
        self._request_ids[job_id] = logs.request_id.get()
        self._spans[job_id] = tracing.current()
        return future

    def close(self, job_id: int) -> bool:
        """Forget job `job_id`; True if it was still waiting for its answer."""
        self._request_ids.pop(job_id, None)
        self._spans.pop(job_id, None)
        return self.inflight.pop(job_id, None) is not None

    def fail_all(self, message: str) -> None:
        for future in self.inflight.values():
            if not future.done():
                future.set_exception(ProviderUnavailable(message))
        self.inflight.clear()

    def deliver(self, frame: FromWorker) -> None:
        """Apply one frame after the handshake; FrameError for one that has no place here."""
        self.heard_at = asyncio.get_running_loop().time()
        if isinstance(frame, Begin):
            self.passes[frame.lane] = self.heard_at
        elif isinstance(frame, Pass):
            self._record(frame)
        elif isinstance(frame, Result | Rejected | JobFailed):
            self._answer(frame)
        elif isinstance(frame, Loaded):
            self._loaded(frame)
        else:
            raise FrameError(f"unexpected {type(frame).__name__} frame")

    def _record(self, frame: Pass) -> None:
        self.passes.pop(frame.lane, None)
        provider = self._provider
        if frame.jobs:
            metrics.FORWARD_PASS.observe(frame.seconds, provider=provider)
            metrics.BATCH_SIZE.observe(len(frame.jobs), provider=provider)
            metrics.BATCH_TOKENS.observe(frame.tokens, provider=provider)
        for job_id in frame.jobs:
            tracing.record(
                "forward_pass",
                self._spans.get(job_id),
                frame.started,
                frame.started + frame.seconds,
                provider=provider,
                jobs=len(frame.jobs),
                rows=frame.rows,
                tokens=frame.tokens,
            )

    def _loaded(self, frame: Loaded) -> None:
        """A checkpoint loaded: the share of its linear layers that run int8, and a warning
        when `DECIDEALOT_PRECISION=int8` left some in fp32 (answers then move less, and cost
        more, than int8 promises)."""
        share = frame.int8_layers / frame.linear_layers if frame.linear_layers else 0.0
        metrics.INT8_LINEAR_SHARE.set(share, provider=self._provider, checkpoint=frame.checkpoint)
        if frame.precision == "int8" and frame.kept_fp32:
            self._log.warning(
                "%s checkpoint %s (%s) runs %d of its %d linear layers in int8 under "
                "DECIDEALOT_PRECISION=int8: the load-time probe kept %s in fp32, whose int8 "
                "error moved its probabilities too far",
                self._provider,
                frame.checkpoint,
                frame.path,
                frame.int8_layers,
                frame.linear_layers,
                ", ".join(frame.kept_fp32),
            )

    def _answer(self, frame: Result | Rejected | JobFailed) -> None:
        future = self.inflight.pop(frame.id, None)
        if future is None or future.done():
            return  # its caller gave up waiting
        if isinstance(frame, Result):
            future.set_result(frame.decision)
        elif isinstance(frame, Rejected):
            future.set_exception(RequestInvalid(frame.issues))
        else:
            token = logs.request_id.set(self._request_ids.get(frame.id, "-"))
            self._log.error("worker failed job %d (%s)", frame.id, frame.error)
            logs.request_id.reset(token)
            future.set_exception(ProviderUnavailable(FAILED_JOB))


class _Worker:
    """One worker process and the jobs in flight on it; discarded once it stops, or handed to
    another runtime by `ProcessRuntime.release`."""

    def __init__(
        self, process: asyncio.subprocess.Process, channel: JobChannel, log: logging.Logger
    ) -> None:
        self.process = process
        self.channel = channel
        self.log = log
        """Its owner's logger: the worker's stderr lines go there."""
        self.alive = True
        self.write_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task[None]] = []
        """Its stderr forwarder and frame reader, which end with the process."""
        self.reader: asyncio.Task[None] | None = None
        """The frame reader of its current owner."""
        self.watchdog: asyncio.Task[None] | None = None
        """Sleeps between checks: cancelled when the worker stops."""
        self.released: asyncio.Future[Released | None] | None = None
        """Set while a `Release` awaits its answer (None: the worker went away first)."""

    def adopt(self, channel: JobChannel, log: logging.Logger) -> None:
        """A new owner's: its jobs, its logger."""
        self.channel, self.log = channel, log
        self.alive, self.released = True, None

    def overdue(self, now: float, pass_timeout: float, silence_timeout: float) -> str | None:
        """Why the worker counts as hung: a pass ran past `pass_timeout`, or jobs wait while
        no pass runs and it has said nothing for `silence_timeout` (preparing a job, which may
        load a checkpoint on first use, gets as long as a start)."""
        channel = self.channel
        if any(now - began > pass_timeout for began in channel.passes.values()):
            return f"ran one pass for over {pass_timeout:g} s"
        if channel.inflight and not channel.passes and now - channel.heard_at > silence_timeout:
            return f"answered nothing for over {silence_timeout:g} s"
        return None

    async def send(self, frame: bytes) -> None:
        try:
            async with self.write_lock:
                self.process.stdin.write(frame)  # type: ignore[union-attr]
                await self.process.stdin.drain()  # type: ignore[union-attr]
        except ConnectionError:
            pass  # the worker is gone; its reader task fails the futures

    def abandon(self, message: str) -> None:
        """Fail every job in flight and kill the process; its reader task reaps it."""
        self.alive = False
        self.channel.fail_all(message)
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


class ProcessRuntime:
    """A local provider's worker process (`decidealot.protocols.LocalRuntime`).

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

    async def load(self, replacing: LocalRuntime | None = None) -> None:
        """Start the worker. `replacing` (a runtime residency evicts to make room) is unloaded
        first; when it is a `ProcessRuntime` on the same interpreter, its worker process is
        taken over with its engine dropped and memory returned, instead of a new one started."""
        async with self._lifecycle:
            spare = None
            if isinstance(replacing, ProcessRuntime) and replacing._python == self._python:
                spare = await replacing.release()
            elif replacing is not None:
                await replacing.unload()
            if self.loaded:
                if spare is not None:
                    await self._stop(spare)
                return
            self._worker = await self._start(spare)

    async def unload(self) -> None:
        async with self._lifecycle:
            worker, self._worker = self._worker, None
            if worker is not None:
                await self._stop(worker)

    async def release(self) -> _Worker | None:
        """Unload, but keep the worker process: it drops its engine, returns its memory and
        waits for another engine's `Start` (the caller's to send, or to stop it). None when
        there is no process to hand over: not loaded, or it did not release within
        `EXIT_GRACE_SECONDS` (then it was killed)."""
        async with self._lifecycle:
            worker, self._worker = self._worker, None
            if worker is None:
                return None
            if not worker.alive:
                await self._stop(worker)
                return None
            return await self._release(worker)

    async def submit(self, job: Job, sent: Callable[[], None] | None = None) -> Decision:
        """Run one job on the loaded worker, batched with whatever else is in flight; `sent`
        is called once its frame is written.

        Raises `RequestInvalid` for input the engine rejects and `ProviderUnavailable` when the
        worker is not loaded, dies, hangs or fails on this job.
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
        future = worker.channel.open(job_id)
        try:
            await worker.send(frame)
            if sent is not None:
                sent()
            return await future
        except asyncio.CancelledError:
            if worker.channel.close(job_id) and worker.alive:
                metrics.JOBS_WITHDRAWN.inc(provider=self.name)
                _background(worker.send(encode(Cancel(job_id))))
            raise
        finally:
            worker.channel.close(job_id)

    async def _watch(self, worker: _Worker) -> None:
        """Kill the worker once a pass overruns the timeout or it falls silent with jobs
        waiting; checks a few times per pass timeout."""
        timeout = self._settings.provider_timeout_seconds
        silence = max(timeout, self._settings.provider_start_timeout_seconds)
        loop = asyncio.get_running_loop()
        while worker.alive:
            await asyncio.sleep(min(timeout / 4, 1.0))
            why = worker.overdue(loop.time(), timeout, silence) if worker.alive else None
            if why is not None:
                self._log.error("worker %s; killing it (pid %d)", why, worker.process.pid)
                self._forget(worker)
                self._lose("timeout")
                worker.abandon(TIMED_OUT)

    # -- process lifecycle -----------------------------------------------------------------

    async def _start(self, spare: _Worker | None = None) -> _Worker:
        """A worker process running this runtime's engine: `spare` (a released one) or a new
        one."""
        if spare is not None:
            worker = spare
            worker.adopt(JobChannel(self.name, self._log), self._log)
            process = worker.process
            self._log.info("starting engine in worker (pid %d) on %s", process.pid, self.device)
        else:
            worker = await self._spawn()
            process = worker.process
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
        if spare is None:
            metrics.WORKER_STARTS.inc(provider=self.name)
        else:
            metrics.WORKER_REUSES.inc(provider=self.name)
        if self._lost:
            self._lost = False
            metrics.WORKER_RESTARTS.inc(provider=self.name)
        worker.reader = _background(self._read_answers(worker))
        worker.tasks.append(worker.reader)
        worker.watchdog = _background(self._watch(worker))
        return worker

    async def _spawn(self) -> _Worker:
        try:
            process = await asyncio.create_subprocess_exec(
                self._python,
                "-P",  # the installed package, never a same-named folder in the working directory
                "-m",
                "decidealot.providers.worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=worker_environment(),
                limit=_STDERR_LINE_LIMIT,
            )
        except OSError as exc:
            self._log.error("cannot start a worker with %s (%s)", self._python, exc.strerror)
            metrics.WORKER_FAILURES.inc(provider=self.name, reason="start_failed")
            raise ProviderUnavailable(START_FAILED) from None
        worker = _Worker(process, JobChannel(self.name, self._log), self._log)
        worker.tasks.append(_background(_forward_stderr(worker)))
        return worker

    async def _release(self, worker: _Worker) -> _Worker | None:
        """Send `Release` and wait for `Released`; the worker's reader ends there, leaving its
        stdout at the next frame for the new owner's handshake."""
        worker.alive = False
        if worker.watchdog is not None:
            worker.watchdog.cancel()
        worker.channel.fail_all(STOPPED)
        released = worker.released = asyncio.get_running_loop().create_future()
        await worker.send(encode(Release()))
        try:
            answer = await asyncio.wait_for(asyncio.shield(released), EXIT_GRACE_SECONDS)
        except TimeoutError:
            answer = None
            self._log.warning("worker did not release within %g s; ending it", EXIT_GRACE_SECONDS)
        if answer is None:
            await self._stop(worker, kill=True)
            return None
        if worker.reader is not None:
            await worker.reader
            worker.tasks.remove(worker.reader)
            worker.reader = None
        self._log.info(
            "worker released (pid %d, %.0f MB resident)", worker.process.pid, answer.rss_bytes / 1e6
        )
        return worker

    async def _handshake(self, process: asyncio.subprocess.Process) -> Ready | Failed | None:
        """Send the start frame and read the worker's first answer; None if it went away."""
        start = start_frame(self._spec, self._settings)
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
        if worker.watchdog is not None:
            worker.watchdog.cancel()
        worker.channel.fail_all(STOPPED)
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
        """Deliver each frame to the worker's channel until its stdout ends, or until the
        `Released` that answers a `Release`."""
        stdout = worker.process.stdout
        assert stdout is not None
        malformed = False
        try:
            while (payload := await read_payload_async(stdout)) is not None:
                frame = decode_from_worker(payload)
                if isinstance(frame, Released) and worker.released is not None:
                    worker.released.set_result(frame)
                    return
                worker.channel.deliver(frame)
        except FrameError as exc:
            self._log.error("worker sent a malformed frame (%s); killing it", exc)
            malformed = True
        if worker.released is not None and not worker.released.done():
            worker.released.set_result(None)  # `_release` kills and reaps it
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


async def _forward_stderr(worker: _Worker) -> None:
    """The worker's stderr into its owner's log, a line per record; lines that start with a
    level name take it, continuation lines (tracebacks) keep the previous one."""
    stderr = worker.process.stderr
    assert stderr is not None
    level = logging.WARNING
    while True:
        try:
            line = await stderr.readline()
        except ValueError:
            worker.log.warning("worker wrote an overlong stderr line; dropped")
            continue
        if not line:
            return
        text = line.decode(errors="replace").rstrip()
        if not text:
            continue
        named = logging.getLevelName(text.split(" ", 1)[0])
        if isinstance(named, int):
            level = named
        worker.log.log(level, "%s", text)
