"""The gateway's side of the seam: `WorkerClient`, the one handle on a worker process (its
process, reader, watchdog, jobs in flight and loads), and `ProcessRuntime`, the local runtime
residency loads and unloads over such clients. Only the client changes its `State`:

    spare --start--> starting --Ready--> ready --release--> releasing --Released--> spare
    any state --exit, garbage, hung pass, stall--> lost;  --stop--> stopped

A model switch hands a released client, process and all, to the next provider's runtime: a
switch pays for the model, not for an interpreter and torch. A lost worker is killed, its jobs
fail with `ProviderUnavailable`, and the next request starts a new one (the watchdog's rules:
docs/architecture.md, "The seam"). Workers never outlive the gateway: they end when their stdin
closes, and the kernel kills them when the gateway dies (`PR_SET_PDEATHSIG`, which fires when
the thread that started the worker exits, i.e. the event loop's thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import itertools
import logging
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec

from decidealot import logs, metrics, tracing
from decidealot.config import Settings
from decidealot.device import (
    concurrent_passes,
    request_token_limit,
    resolve_device,
    token_budget,
    worker_environment,
)
from decidealot.errors import ProviderUnavailable, RequestInvalid
from decidealot.jobs import CheckpointLoad, Decision, EngineSpec, Job
from decidealot.protocols import LocalRuntime
from decidealot.providers.engine.protocol import (
    Cancel,
    Failed,
    FrameError,
    FromWorker,
    Heartbeat,
    JobFailed,
    Loaded,
    PassDone,
    Ready,
    Rejected,
    Release,
    Released,
    Result,
    Start,
    Submit,
    decode_from_worker,
    encode,
    read_payload_async,
)

log = logging.getLogger("decidealot.runtime")

START_FAILED = "the local provider could not start"
STOPPED = "the local provider stopped before answering"
TIMED_OUT = "the local provider timed out"
NOT_LOADED = "the local provider is not loaded"
FAILED_JOB = "the local provider failed to answer"

EXIT_GRACE_SECONDS = 5.0
"""How long a stopped worker may take to exit after its stdin closes, or a released one to
answer `Released`, before it is killed."""

STDERR_LINE_LIMIT = 1 << 20
"""The longest stderr line forwarded whole (the stream reader's limit)."""


def start_frame(spec: EngineSpec, settings: Settings) -> Start:
    """A heartbeat a few times per pass timeout, so that a stall shows well within it."""
    return Start(
        spec,
        token_budget(settings, spec.device),
        compute_threads=concurrent_passes(settings, spec.device),
        job_token_limit=request_token_limit(settings, spec.device),
        heartbeat_seconds=min(settings.provider_timeout_seconds / 4, 1.0),
    )


def background(work: Coroutine[object, object, None]) -> asyncio.Task[None]:
    """A task for a worker's lifetime, outside the context of the request that started it, so
    its log lines do not carry that request's id."""
    return asyncio.create_task(work, context=contextvars.Context())


class Link(Protocol):
    """A client's connection to its worker: a subprocess's pipes, or a worker loop in a thread
    (`inprocess`)."""

    pid: int
    stderr: asyncio.StreamReader | None

    async def send(self, frame: bytes) -> None:
        """Nothing when the worker has gone: its reader finds out."""

    async def receive(self) -> bytes | None: ...

    def kill(self) -> None: ...

    async def wait(self) -> int: ...

    async def close(self, kill: bool) -> None:
        """Its input closes, then a kill after `EXIT_GRACE_SECONDS` (at once with `kill`)."""

    def moving(self) -> bool:
        """Whether it used CPU since the last call and is not stopped (False where unknown):
        a worker whose import holds the GIL sends nothing for a second, but is not stalled."""


class PipeLink:
    """A worker subprocess (`python -m decidealot.providers.engine`) and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.pid = process.pid
        self.stderr = process.stderr
        self._writing = asyncio.Lock()
        self._ticks = -1

    @classmethod
    async def spawn(cls, python: str) -> PipeLink:
        process = await asyncio.create_subprocess_exec(
            python,
            "-P",  # the installed package, never a same-named folder in the working directory
            "-m",
            "decidealot.providers.engine",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=worker_environment(),
            limit=STDERR_LINE_LIMIT,
        )
        return cls(process)

    async def send(self, frame: bytes) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            async with self._writing:
                stdin.write(frame)
                await stdin.drain()
        except ConnectionError:
            pass

    async def receive(self) -> bytes | None:
        assert self._process.stdout is not None
        return await read_payload_async(self._process.stdout)

    def kill(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    async def wait(self) -> int:
        return await self._process.wait()

    async def close(self, kill: bool) -> None:
        stdin = self._process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        if kill:
            self.kill()
        try:
            await asyncio.wait_for(self._process.wait(), EXIT_GRACE_SECONDS)
        except TimeoutError:
            self.kill()
            await self._process.wait()

    def moving(self) -> bool:
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return False
        state, ticks = fields[0], int(fields[11]) + int(fields[12])
        moved, self._ticks = ticks > self._ticks, ticks
        return state in "RD" or (moved and state not in "Tt")


class State(enum.Enum):
    SPARE = "spare"
    """Up, with no engine: new, or released; waits for a `Start`."""
    STARTING = "starting"
    READY = "ready"
    RELEASING = "releasing"
    LOST = "lost"
    """Exited, hung, stalled or garbled: killed, never used again."""
    STOPPED = "stopped"


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Decision]
    request_id: str
    """For the log line of the job's failure."""
    span: tracing.SpanContext | None
    """What its forward passes' spans hang under."""


class WorkerClient:
    """One worker process, seen from the gateway."""

    def __init__(self, link: Link, settings: Settings, log: logging.Logger) -> None:
        self._link = link
        self._pass_timeout = settings.provider_timeout_seconds
        self._start_timeout = settings.provider_start_timeout_seconds
        self.log = log
        """Its current owner's: its stderr lines go there too."""
        self.owner = ""
        """The provider whose engine it runs, for metric labels."""
        self.state = State.SPARE
        self.loads: dict[str, CheckpointLoad] = {}
        # Not a second ledger: the ledger counts requests; these are the futures a message answers.
        self._jobs: dict[int, _Waiter] = {}
        """Answers come back by id from another process: this is their way back, not a count
        (the gateway's one ledger of work is `decidealot.ledger`)."""
        self._ids = itertools.count(1)
        self._answer: asyncio.Future[Ready | Failed | Released | None] | None = None
        """The `Start` or `Release` waiting for its answer (None: the worker went away)."""
        self._heard = asyncio.get_running_loop().time()
        """When it last sent a frame, or when work began to wait on it."""
        # what runs there and since when (loop time), by its heartbeats
        self._passes: dict[int, float] = {}
        self._preparing: float | None = None
        self._quiet: float | None = None
        self._tasks = [background(self._read())]
        self._watchdog = background(self._watch())
        if link.stderr is not None:
            self._tasks.append(background(self._forward_stderr(link.stderr)))

    @property
    def pid(self) -> int:
        return self._link.pid

    async def start(self, start: Start, owner: str, log: logging.Logger) -> None:
        """ProviderUnavailable, the worker stopped, where the engine cannot be built."""
        assert self.state is State.SPARE
        self.owner, self.log, self.state = owner, log, State.STARTING
        answer = await self._ask(start, self._start_timeout)
        if isinstance(answer, Ready):
            self.state = State.READY
            log.info("worker ready (pid %d, %s)", self.pid, answer.device)
            return
        if isinstance(answer, Failed):
            log.error("worker failed to start (%s)", answer.error)
        elif self.state is State.STARTING:
            log.error("worker not ready within %g s; killing it", self._start_timeout)
        metrics.WORKER_FAILURES.inc(provider=owner, reason="start_failed")
        await self.stop(kill=True)
        raise ProviderUnavailable(START_FAILED)

    async def release(self) -> bool:
        """Drop the engine, keep the process; False when it does not answer within
        `EXIT_GRACE_SECONDS` (then it is killed)."""
        assert self.state is State.READY
        self.state = State.RELEASING
        self._end_engine(STOPPED)
        answer = await self._ask(Release(), EXIT_GRACE_SECONDS)
        if not isinstance(answer, Released):
            if self.state is State.RELEASING:
                self.log.warning(
                    "worker did not release within %g s; ending it", EXIT_GRACE_SECONDS
                )
            await self.stop(kill=True)
            return False
        self.state = State.SPARE
        self.log.info(
            "worker released (pid %d, %.0f MB resident)", self.pid, answer.rss_bytes / 1e6
        )
        return True

    async def stop(self, *, kill: bool = False) -> None:
        """Its stdin closes (a worker exits by itself), then a kill after a grace."""
        self.state = State.STOPPED
        self._watchdog.cancel()
        self._end_engine(STOPPED)
        await self._link.close(kill)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.log.info("worker stopped (pid %d)", self.pid)

    async def submit(self, job: Job, sent: Callable[[], None] | None = None) -> Decision:
        """`sent` is called once the job is written; cancelling the call withdraws the job."""
        if self.state is not State.READY:
            raise ProviderUnavailable(NOT_LOADED)
        job_id = next(self._ids)
        try:
            frame = encode(Submit(job_id, job))
        except OverflowError:  # msgpack holds 64-bit integers; JSON input may hold larger
            self.log.error("a job holds an integer beyond 64 bits; not sent")
            raise ProviderUnavailable(FAILED_JOB) from None
        loop = asyncio.get_running_loop()
        if not self._jobs:  # an idle worker's silence, and what it last said, count no more
            self._heard, self._passes, self._preparing, self._quiet = loop.time(), {}, None, None
        future: asyncio.Future[Decision] = loop.create_future()
        self._jobs[job_id] = _Waiter(future, logs.request_id.get(), tracing.current())
        try:
            await self._link.send(frame)
            if sent is not None:
                sent()
            return await future
        except asyncio.CancelledError:
            if self._jobs.pop(job_id, None) is not None and self.state is State.READY:
                metrics.JOBS_WITHDRAWN.inc(provider=self.owner)
                background(self._link.send(encode(Cancel(job_id))))
            raise
        finally:
            self._jobs.pop(job_id, None)

    async def _ask(
        self, frame: Start | Release, timeout: float
    ) -> Ready | Failed | Released | None:
        """Its answer; None on a timeout or a lost worker."""
        self._heard = asyncio.get_running_loop().time()
        answer = self._answer = asyncio.get_running_loop().create_future()
        await self._link.send(encode(frame))
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except TimeoutError:
            return None
        except BaseException:
            await self.stop(kill=True)
            raise
        finally:
            self._answer = None

    def _end_engine(self, message: str) -> None:
        """Its jobs fail with `message`, and its checkpoints' gauges go: `/metrics` describes
        no checkpoint that is not loaded."""
        for waiter in self._jobs.values():
            if not waiter.future.done():
                waiter.future.set_exception(ProviderUnavailable(message))
        self._jobs.clear()
        for checkpoint in self.loads:
            metrics.INT8_LINEAR_SHARE.remove(provider=self.owner, checkpoint=checkpoint)
            metrics.PRECISION_INFO.remove(provider=self.owner, checkpoint=checkpoint)
            metrics.PASSES_INFO.remove(provider=self.owner, checkpoint=checkpoint)
        self.loads.clear()
        self._passes, self._preparing, self._quiet = {}, None, None
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(None)

    def _lose(self, reason: str, message: str) -> None:
        """Counted as a failure where it was serving."""
        if self.state in (State.LOST, State.STOPPED):
            return
        if self.state is State.READY:
            metrics.WORKER_FAILURES.inc(provider=self.owner, reason=reason)
        self.state = State.LOST
        self._end_engine(message)
        self._link.kill()

    # -- what the worker sends ---------------------------------------------------------------

    async def _read(self) -> None:
        malformed = False
        try:
            while (payload := await self._link.receive()) is not None:
                self._deliver(decode_from_worker(payload))
        except FrameError as exc:
            self.log.error("worker sent a malformed frame (%s); killing it", exc)
            malformed = True
        serving, starting = self.state is State.READY, self.state is State.STARTING
        self._lose("malformed" if malformed else "exited", STOPPED)
        code = await self._link.wait()
        if serving:
            self.log.error("worker exited unexpectedly (pid %d, code %d)", self.pid, code)
        elif starting and not malformed:
            self.log.error("worker exited before it was ready (pid %d, code %d)", self.pid, code)

    def _deliver(self, frame: FromWorker) -> None:
        now = asyncio.get_running_loop().time()
        self._heard = now
        if isinstance(frame, Heartbeat):
            self._passes = {thread: now - took for thread, took in frame.passes.items()}
            self._preparing = now - frame.preparing if frame.preparing else None
            self._quiet = now - frame.idle if frame.idle else None
            return
        self._quiet = None
        if isinstance(frame, Result | Rejected | JobFailed):
            self._answered(frame)
        elif isinstance(frame, PassDone):
            self._passes.pop(frame.thread, None)
            self._record(frame)
        elif isinstance(frame, Loaded):
            if self.state in (State.STARTING, State.READY):
                self._loaded(frame.load)
        elif self._answer is not None and not self._answer.done():
            self._answer.set_result(frame)
        else:
            raise FrameError(f"unexpected {type(frame).__name__} frame")

    def _answered(self, frame: Result | Rejected | JobFailed) -> None:
        waiter = self._jobs.pop(frame.id, None)
        if waiter is None or waiter.future.done():
            return  # its caller gave up waiting
        if isinstance(frame, Result):
            waiter.future.set_result(frame.decision)
        elif isinstance(frame, Rejected):
            waiter.future.set_exception(RequestInvalid(frame.issues))
        else:
            token = logs.request_id.set(waiter.request_id)
            self.log.error("worker failed job %d (%s)", frame.id, frame.error)
            logs.request_id.reset(token)
            waiter.future.set_exception(ProviderUnavailable(FAILED_JOB))

    def _record(self, frame: PassDone) -> None:
        if frame.jobs:
            metrics.FORWARD_PASS.observe(frame.seconds, provider=self.owner)
            metrics.BATCH_SIZE.observe(len(frame.jobs), provider=self.owner)
            metrics.BATCH_TOKENS.observe(frame.tokens, provider=self.owner)
        for job_id in frame.jobs:
            waiter = self._jobs.get(job_id)
            tracing.record(
                "forward_pass",
                None if waiter is None else waiter.span,
                frame.started,
                frame.started + frame.seconds,
                provider=self.owner,
                jobs=len(frame.jobs),
                rows=frame.rows,
                tokens=frame.tokens,
            )

    def _loaded(self, load: CheckpointLoad) -> None:
        """A warning where bf16's probe put fp32 back, or where int8 left layers in fp32 (its
        answers then move less, and cost more, than int8 promises). A checkpoint reported
        again has had its pass compiled, or kept eager: that alone is logged."""
        before = self.loads.get(load.checkpoint)
        self.loads[load.checkpoint] = load
        owner, checkpoint = self.owner, load.checkpoint
        metrics.PASSES_INFO.set(
            provider=owner, checkpoint=checkpoint, passes=load.passes, state=load.compile_state
        )
        if before is not None:
            failed = load.compile_state in ("probe_failed", "failed")  # no compiler: said once
            self.log.log(
                logging.WARNING if failed else logging.INFO,
                "%s checkpoint %s (%s) passes run %s (DECIDEALOT_COMPILE: %s)",
                owner,
                checkpoint,
                load.path,
                load.passes,
                load.compile_reason,
            )
            return
        self.log.log(
            logging.WARNING if load.probe_fallback else logging.INFO,
            "%s checkpoint %s (%s) runs %s (DECIDEALOT_PRECISION=%s: %s)",
            owner,
            checkpoint,
            load.path,
            load.precision,
            load.requested,
            load.reason,
        )
        metrics.PRECISION_INFO.set(
            provider=owner,
            checkpoint=checkpoint,
            precision=load.precision,
            requested=load.requested,
            reason=load.reason,
        )
        metrics.INT8_LINEAR_SHARE.set(load.int8_share, provider=owner, checkpoint=checkpoint)
        if load.precision == "int8" and load.kept_fp32:
            self.log.warning(
                "%s checkpoint %s (%s) runs %d of its %d linear layers in int8 under "
                "DECIDEALOT_PRECISION=int8: the load-time probe kept %s in fp32, whose int8 "
                "error moved its probabilities too far",
                owner,
                checkpoint,
                load.path,
                load.int8_layers,
                load.linear_layers,
                ", ".join(load.kept_fp32),
            )

    async def _forward_stderr(self, stderr: asyncio.StreamReader) -> None:
        """A line per record; a line starting with a level name takes it, continuation lines
        (tracebacks) keep the previous one."""
        level = logging.WARNING
        while True:
            try:
                line = await stderr.readline()
            except ValueError:
                self.log.warning("worker wrote an overlong stderr line; dropped")
                continue
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            if not text:
                continue
            named = logging.getLevelName(text.split(" ", 1)[0])
            if isinstance(named, int):
                level = named
            self.log.log(level, "%s", text)

    # -- the watchdog ------------------------------------------------------------------------

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.state not in (State.LOST, State.STOPPED):
            await asyncio.sleep(min(self._pass_timeout / 4, 1.0))
            why = self._overdue(loop.time())
            if why is not None:
                self.log.error("worker %s; killing it (pid %d)", why, self.pid)
                self._lose("timeout", TIMED_OUT)

    def _overdue(self, now: float) -> str | None:
        """Why the worker counts as hung or stalled, if it does."""
        timeout = self._pass_timeout
        if any(now - began > timeout for began in self._passes.values()):
            return f"ran one pass for over {timeout:g} s"
        preparing = self._preparing if self.state is State.READY else None
        if preparing is not None and now - preparing > self._start_timeout:
            return f"prepared one job for over {self._start_timeout:g} s"
        waiting = self.state is State.STARTING or (self.state is State.READY and self._jobs)
        if not waiting:
            return None
        if now - self._heard > timeout and not self._link.moving():
            return f"answered nothing for over {timeout:g} s"
        if self._jobs and self._quiet is not None and now - self._quiet > timeout:
            return f"held jobs and ran nothing for over {timeout:g} s"
        return None


class ProcessRuntime:
    """A local provider's worker (`LocalRuntime`). It applies `DECIDEALOT_DEVICE` and
    `DECIDEALOT_TORCH_THREADS` to the spec, so every local provider honours them alike."""

    def __init__(self, name: str, spec: EngineSpec, settings: Settings) -> None:
        self.name = name
        self.device = resolve_device(settings)
        self.spec = msgspec.structs.replace(
            spec, device=self.device, torch_threads=settings.torch_threads
        )
        self._settings = settings
        self._python = settings.worker_python or sys.executable
        self._client: WorkerClient | None = None
        self._lifecycle = asyncio.Lock()
        self._log = log.getChild(name)
        self._restarting = False

    @property
    def loaded(self) -> bool:
        return self._client is not None and self._client.state is State.READY

    def checkpoints(self) -> list[CheckpointLoad]:
        """How its worker loaded each checkpoint it holds."""
        client = self._client
        return list(client.loads.values()) if client is not None and self.loaded else []

    async def load(self, replacing: LocalRuntime | None = None) -> None:
        """`replacing` (evicted to make room) unloads first; a `ProcessRuntime` of the same kind
        hands its worker process over instead."""
        async with self._lifecycle:
            spare = None
            if isinstance(replacing, ProcessRuntime) and replacing._reuses(self):
                spare = await replacing._release()
            elif replacing is not None:
                await replacing.unload()
            if self.loaded:
                if spare is not None:
                    await spare.stop()
                return
            self._take()
            if spare is None:
                client = await self._spawn()
                self._log.info("starting worker (pid %d) on %s", client.pid, self.device)
            else:
                client = spare
                self._log.info("starting engine in worker (pid %d) on %s", client.pid, self.device)
            self._client = client
            await client.start(start_frame(self.spec, self._settings), self.name, self._log)
            counter = metrics.WORKER_STARTS if spare is None else metrics.WORKER_REUSES
            counter.inc(provider=self.name)
            if self._restarting:
                self._restarting = False
                metrics.WORKER_RESTARTS.inc(provider=self.name)

    async def unload(self) -> None:
        async with self._lifecycle:
            client = self._take()
            if client is not None and client.state is not State.STOPPED:
                await client.stop()

    async def submit(self, job: Job, sent: Callable[[], None] | None = None) -> Decision:
        client = self._client
        if client is None:
            raise ProviderUnavailable(NOT_LOADED)
        return await client.submit(job, sent)

    def _reuses(self, other: ProcessRuntime) -> bool:
        return type(other) is type(self) and other._python == self._python

    async def _release(self) -> WorkerClient | None:
        """Unload, handing the worker process over; None when there is none to hand over."""
        async with self._lifecycle:
            client = self._take()
            if client is None:
                return None
            if client.state is not State.READY:
                await client.stop()
                return None
            return client if await client.release() else None

    def _take(self) -> WorkerClient | None:
        """A lost one makes the next start a restart."""
        client, self._client = self._client, None
        if client is not None and client.state is State.LOST:
            self._restarting = True
        return client

    async def _spawn(self) -> WorkerClient:
        try:
            link: Link = await PipeLink.spawn(self._python)
        except OSError as exc:
            self._log.error("cannot start a worker with %s (%s)", self._python, exc.strerror)
            metrics.WORKER_FAILURES.inc(provider=self.name, reason="start_failed")
            raise ProviderUnavailable(START_FAILED) from None
        return WorkerClient(link, self._settings, self._log)
