"""One worker's jobs in flight, on the gateway side: a future per job id, and what each frame
the worker sends does to them (answers, pass metrics and spans, checkpoint loads). The process
runtime and the in-process runtime share it."""

from __future__ import annotations

import asyncio
import logging

from decidealot import logs, metrics, tracing
from decidealot.errors import ProviderUnavailable, RequestInvalid
from decidealot.frames import (
    FrameError,
    FromWorker,
    JobFailed,
    Loaded,
    PassBegun,
    PassDone,
    Rejected,
    Result,
)
from decidealot.jobs import Decision

FAILED_JOB = "the local provider failed to answer"


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
        """Compute thread -> when its running pass began."""
        self.loads: dict[str, Loaded] = {}
        """Checkpoint -> how the worker reported loading it (`Loaded`): for the status view,
        and the gauges `end` removes."""
        self._ended = False

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

    def end(self, message: str) -> None:
        """The engine behind this channel is gone (unloaded, released for another provider's,
        or its worker lost): every job in flight fails with `message`, and the gauges of the
        checkpoints it reported are removed, so that `/metrics` describes no checkpoint that is
        not loaded; a `Loaded` frame that still arrives sets none."""
        self._ended = True
        for future in self.inflight.values():
            if not future.done():
                future.set_exception(ProviderUnavailable(message))
        self.inflight.clear()
        for checkpoint in self.loads:
            metrics.INT8_LINEAR_SHARE.remove(provider=self._provider, checkpoint=checkpoint)
            metrics.PRECISION_INFO.remove(provider=self._provider, checkpoint=checkpoint)
        self.loads.clear()

    def deliver(self, frame: FromWorker) -> None:
        """Apply one frame after the handshake; FrameError for one that has no place here."""
        self.heard_at = asyncio.get_running_loop().time()
        if isinstance(frame, PassBegun):
            self.passes[frame.thread] = self.heard_at
        elif isinstance(frame, PassDone):
            self._record(frame)
        elif isinstance(frame, Result | Rejected | JobFailed):
            self._answer(frame)
        elif isinstance(frame, Loaded):
            self._loaded(frame)
        else:
            raise FrameError(f"unexpected {type(frame).__name__} frame")

    def _record(self, frame: PassDone) -> None:
        self.passes.pop(frame.thread, None)
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
        """A checkpoint loaded: one line saying the precision it runs in and why (a warning
        where bf16's load probe put fp32 back), `decidealot_precision_info`, the share of its
        linear layers that run int8, and a warning when `DECIDEALOT_PRECISION=int8` left some
        in fp32 (answers then move less, and cost more, than int8 promises). None once `end`ed."""
        if self._ended:
            return
        self.loads[frame.checkpoint] = frame
        level = logging.WARNING if frame.probe_fallback else logging.INFO
        self._log.log(
            level,
            "%s checkpoint %s (%s) runs %s (DECIDEALOT_PRECISION=%s: %s)",
            self._provider,
            frame.checkpoint,
            frame.path,
            frame.precision,
            frame.requested,
            frame.reason,
        )
        metrics.PRECISION_INFO.set(
            provider=self._provider,
            checkpoint=frame.checkpoint,
            precision=frame.precision,
            requested=frame.requested,
            reason=frame.reason,
        )
        metrics.INT8_LINEAR_SHARE.set(
            frame.int8_share, provider=self._provider, checkpoint=frame.checkpoint
        )
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
