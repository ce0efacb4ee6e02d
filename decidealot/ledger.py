"""`Ledger`: the gateway's one record of the work in flight: each admitted request (HTTP or
MCP), which of them hold a place under `DECIDEALOT_MAX_PENDING_REQUESTS` (a local decision
request; a batch counts once), and each local decision's claim on its provider's residency slot.
Admission, the drain, residency's evictions and unload's 409, `/v1/status` and `/metrics` (the
queue gauges an autoscaler reads) read it here; nothing else counts this work.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from decidealot import metrics, tracing
from decidealot.errors import ProviderOverloaded, ShuttingDown

log = logging.getLogger("decidealot.service")

UNWIND_SECONDS = 5.0
"""How long requests cancelled at the end of a drain get to unwind and answer."""

ADMITTED = contextvars.ContextVar[asyncio.Task[Any] | None]("decidealot_admitted", default=None)
"""The task of the admitted request being served here, where a transport hands its work to
another task (the MCP SDK runs each `/mcp` tool call on a task of its own): see `cut_instead`."""

CUT_SHORT = ShuttingDown("the service shut down before this request finished")
"""What a request the drain cancelled is answered (503)."""


class Claim:
    """One local decision's claim on its provider's residency slot: waiting, then holding."""

    def __init__(self, ledger: Ledger, provider: str) -> None:
        self._ledger, self.provider, self.holding = ledger, provider, False
        self.since = time.monotonic()
        ledger._waiting.setdefault(provider, {})[self] = None

    def hold(self) -> None:
        ledger = self._ledger
        del ledger._waiting[self.provider][self]
        ledger._holding[self.provider] += 1
        self.holding = True

    def end(self) -> None:
        if self.holding:
            self._ledger._holding[self.provider] -= 1
        else:
            del self._ledger._waiting[self.provider][self]


class Ledger:
    def __init__(self, max_pending: int = 0) -> None:
        self.max_pending = max_pending
        self.draining = False
        self.requests = 0  # what a drain waits for
        self.pending = 0  # under DECIDEALOT_MAX_PENDING_REQUESTS
        self._tasks: set[asyncio.Task[Any]] = set()
        """The admitted requests' own tasks (or those doing their work): what a drain cuts."""
        self._cut: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._waiting: dict[str, dict[Claim, None]] = {}  # per provider, oldest first
        self._holding: Counter[str] = Counter()

    # -- requests ------------------------------------------------------------------------------

    def enter(self, task: asyncio.Task[Any] | None = None) -> bool:
        """False once draining. A drain that runs out cancels `task`."""
        if self.draining:
            return False
        self.requests += 1
        self._idle.clear()
        if task is not None:
            self._tasks.add(task)
        return True

    def leave(self, task: asyncio.Task[Any] | None = None) -> None:
        if task is not None:
            self._tasks.discard(task)
            self._cut.discard(task)
        self.requests -= 1
        if self.requests == 0:
            self._idle.set()

    @contextlib.contextmanager
    def cut_instead(
        self, request: asyncio.Task[Any] | None, worker: asyncio.Task[Any] | None
    ) -> Iterator[None]:
        """While the block runs, a drain that runs out cancels `worker`, the task doing the
        work of admitted request `request`, instead of `request` itself: the work then answers
        `CUT_SHORT` in its own terms (an MCP tool error) and the request's response completes,
        where cancelling the request would cut its response off. Nothing changes for a request
        not admitted with its task, or already cut."""
        if request is None or worker is None or request not in self._tasks - self._cut:
            yield
            return
        self._tasks.discard(request)
        self._tasks.add(worker)
        try:
            yield
        finally:
            self._tasks.discard(worker)
            self._cut.discard(worker)
            self._tasks.add(request)

    def was_cut(self, task: asyncio.Task[Any]) -> bool:
        """Then its request is answered `CUT_SHORT`."""
        return task in self._cut

    async def drain(self, seconds: float) -> None:
        """New requests are refused (503); admitted ones run for up to `seconds`
        (`DECIDEALOT_DRAIN_SECONDS`), then are cancelled (answered 503) and may unwind."""
        self.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), seconds)
            return
        log.warning(
            "%d requests still running after %g s of draining (DECIDEALOT_DRAIN_SECONDS): "
            "answering them 503",
            self.requests,
            seconds,
        )
        self._cut = set(self._tasks)
        for task in self._cut:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), UNWIND_SECONDS)
            return
        log.warning("%d requests did not unwind after the drain", self.requests)

    # -- local decisions -------------------------------------------------------------------------

    @contextlib.contextmanager
    def pending_request(self) -> Iterator[None]:
        """`ProviderOverloaded` (503) when none is free."""
        with tracing.span("admission", pending=self.pending):
            if self.max_pending and self.pending >= self.max_pending:
                metrics.ADMISSION_REJECTED.inc()
                raise ProviderOverloaded()
            self.pending += 1
        metrics.PENDING_REQUESTS.set(self.pending)
        try:
            yield
        finally:
            self.pending -= 1
            metrics.PENDING_REQUESTS.set(self.pending)

    @contextlib.contextmanager
    def claim(self, provider: str) -> Iterator[Claim]:
        """Waiting until residency's `hold()`."""
        claim = Claim(self, provider)
        try:
            yield claim
        finally:
            claim.end()

    def waiting(self, provider: str | None = None) -> int:
        """Local decisions waiting for a slot (of `provider`; None: any)."""
        if provider:
            return len(self._waiting.get(provider, ()))
        return sum(len(claims) for claims in self._waiting.values())

    def holding(self, provider: str | None = None) -> int:
        return self._holding[provider] if provider else sum(self._holding.values())

    def oldest_waiting(self, provider: str) -> float:
        """Seconds the longest-waiting local decision of `provider` has waited (0: none): a
        queue that stands still (a model switch, a slot held by another) shows here first."""
        oldest = next(iter(self._waiting.get(provider, ())), None)
        return 0.0 if oldest is None else time.monotonic() - oldest.since
