"""The gateway side of a local provider: its worker subprocess, started on demand.

`ProcessRuntime` is what residency loads and unloads: loading starts `python -m
decidealot.providers.worker` and waits for its `Ready` frame; unloading ends the process, so the
memory of torch and the checkpoint returns to the system. A load that replaces another
provider's runtime (a model switch at the slot limit) takes that runtime's worker process over
instead: the worker drops the old engine and returns its memory (`Release` / `Released`), then
builds the new one (`Start`), so a switch pays for the model, not for an interpreter and torch.
Jobs go to the worker as frames and come back by id (`job_channel.JobChannel`, which the
in-process runtime shares), so any number of requests can be in flight at once and the worker
batches them.

A worker that exits, sends garbage or hangs (`watchdog`) is killed; every job in flight on it
fails with `ProviderUnavailable` and `loaded` turns False, so the next request starts a new
worker. A job whose caller is cancelled (its client hung up) is withdrawn with a `Cancel`
frame: its rows not yet in a pass never run.

Workers never outlive the gateway: they end when their stdin closes, and the kernel kills
them when the gateway dies (`PR_SET_PDEATHSIG`, which fires when the thread that started the
worker exits, i.e. when the event loop's thread does). Device policy (which device, pass
sizes, passes at once, the request token bound) lives in `decidealot.device`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
from collections.abc import Callable

import msgspec

from decidealot import metrics
from decidealot.config import Settings
from decidealot.device import resolve_device, start_frame, worker_environment
from decidealot.errors import ProviderUnavailable
from decidealot.frames import (
    Cancel,
    Failed,
    FrameError,
    Loaded,
    Ready,
    Release,
    Released,
    Submit,
    decode_from_worker,
    encode,
    read_payload_async,
)
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.protocols import LocalRuntime
from decidealot.providers.gateway.job_channel import FAILED_JOB, JobChannel
from decidealot.providers.gateway.watchdog import watch
from decidealot.providers.gateway.worker_process import (
    STDERR_LINE_LIMIT,
    WorkerProcess,
    background,
    forward_stderr,
)

log = logging.getLogger("decidealot.runtime")

START_FAILED = "the local provider could not start"
STOPPED = "the local provider stopped before answering"
TIMED_OUT = "the local provider timed out"
NOT_LOADED = "the local provider is not loaded"

EXIT_GRACE_SECONDS = 5.0
"""How long an unloaded worker may take to exit after its stdin closes, or a released one to
answer `Released`, before it is killed."""


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
        self._worker: WorkerProcess | None = None
        self._lifecycle = asyncio.Lock()
        self._job_ids = itertools.count(1)
        self._log = log.getChild(name)
        self._lost = False
        """A worker died, hung or sent garbage; the next start is a restart."""

    @property
    def loaded(self) -> bool:
        return self._worker is not None and self._worker.alive

    def checkpoints(self) -> list[Loaded]:
        """How its worker loaded each checkpoint it holds (`protocols.ReportsCheckpoints`)."""
        worker = self._worker
        if worker is None or not worker.alive:
            return []
        return list(worker.channel.loads.values())

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

    async def release(self) -> WorkerProcess | None:
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
                background(worker.send(encode(Cancel(job_id))))
            raise
        finally:
            worker.channel.close(job_id)

    async def _watch(self, worker: WorkerProcess) -> None:
        why = await watch(worker.channel, lambda: worker.alive, self._settings)
        if why is not None and worker.alive:
            self._log.error("worker %s; killing it (pid %d)", why, worker.process.pid)
            self._forget(worker)
            self._lose("timeout")
            worker.abandon(TIMED_OUT)

    # -- process lifecycle -----------------------------------------------------------------

    async def _start(self, spare: WorkerProcess | None = None) -> WorkerProcess:
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
        worker.reader = background(self._read_answers(worker))
        worker.tasks.append(worker.reader)
        worker.watchdog = background(self._watch(worker))
        return worker

    async def _spawn(self) -> WorkerProcess:
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
                limit=STDERR_LINE_LIMIT,
            )
        except OSError as exc:
            self._log.error("cannot start a worker with %s (%s)", self._python, exc.strerror)
            metrics.WORKER_FAILURES.inc(provider=self.name, reason="start_failed")
            raise ProviderUnavailable(START_FAILED) from None
        worker = WorkerProcess(process, JobChannel(self.name, self._log), self._log)
        worker.tasks.append(background(forward_stderr(worker)))
        return worker

    async def _release(self, worker: WorkerProcess) -> WorkerProcess | None:
        """Send `Release` and wait for `Released`; the worker's reader ends there, leaving its
        stdout at the next frame for the new owner's handshake."""
        worker.alive = False
        if worker.watchdog is not None:
            worker.watchdog.cancel()
        worker.channel.end(STOPPED)
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

    async def _stop(self, worker: WorkerProcess, *, kill: bool = False) -> None:
        """End the process: stdin closes (a ready worker exits by itself), then a kill after
        a grace; at once with `kill`, for a worker that never became ready."""
        worker.alive = False
        if worker.watchdog is not None:
            worker.watchdog.cancel()
        worker.channel.end(STOPPED)
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

    def _forget(self, worker: WorkerProcess) -> None:
        if self._worker is worker:
            self._worker = None

    def _lose(self, reason: str) -> None:
        """Count a worker lost while loaded; its replacement will count as a restart."""
        self._lost = True
        metrics.WORKER_FAILURES.inc(provider=self.name, reason=reason)

    async def _read_answers(self, worker: WorkerProcess) -> None:
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
