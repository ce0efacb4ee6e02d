"""Which local providers are loaded: slots with LRU eviction, FIFO admission, serial lanes.

`DECIDEALOT_MAX_RESIDENT_PROVIDERS` runtimes may be resident (loaded or loading) at once. A
decision for a runtime that is not resident waits in one FIFO queue; when no slot is free the
least recently used idle runtime unloads to make room. Once the head of the queue needs such
an eviction, nothing behind it is admitted, so the runtimes holding slots drain and, with one
slot, Laya and Von take turns instead of one starving the other. Decisions for a resident
runtime are otherwise admitted at once, which is what lets its worker batch them together.

Which decisions wait for a slot and which hold one is the ledger's (`decidealot.ledger`): the
eviction of an idle runtime and the refusal to unload a busy one read it there.

A lane is a second, independent gate: runtimes registered on the same lane take turns holding
it by group, any number of one group's decisions at a time, so passes of different groups
never overlap. `decidealot.service.lane_of` says which lane and group each provider takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from decidealot import metrics, tracing
from decidealot.config import Settings
from decidealot.contract import UnloadedProvider
from decidealot.errors import ProviderBusy, ProviderUnavailable, ShuttingDown
from decidealot.ledger import Claim, Ledger
from decidealot.protocols import LocalRuntime

log = logging.getLogger("decidealot.residency")


@dataclass(eq=False)
class _Slot:
    runtime: LocalRuntime
    lane: str | None
    group: str
    last_used: float = field(default_factory=time.monotonic)
    transition: asyncio.Task[None] | None = None
    """A load or unload in progress; the runtime keeps (or claims) its slot meanwhile."""

    @property
    def ready(self) -> bool:
        return self.transition is None and self.runtime.loaded

    @property
    def resident(self) -> bool:
        return self.transition is not None or self.runtime.loaded


class _Lane:
    """Admits any number of holders from one group at a time; groups take turns in FIFO order."""

    def __init__(self) -> None:
        self._holder: str | None = None
        self._count = 0
        self._waiters: deque[tuple[str, asyncio.Future[None]]] = deque()

    async def acquire(self, group: str) -> None:
        if self._holder is None or (self._holder == group and not self._waiters):
            self._holder = group
            self._count += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (group, future)
        self._waiters.append(waiter)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # admitted just as we were cancelled: give the turn back
            elif waiter in self._waiters:  # a release() since may have dropped it already
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self._count -= 1
        if self._count:
            return
        self._holder = None
        while self._waiters and self._waiters[0][1].done():
            self._waiters.popleft()
        if not self._waiters:
            return
        group = self._waiters[0][0]
        self._holder = group
        remaining: deque[tuple[str, asyncio.Future[None]]] = deque()
        for waiter_group, future in self._waiters:
            if waiter_group == group and not future.done():
                self._count += 1
                future.set_result(None)
            elif not future.done():
                remaining.append((waiter_group, future))
        self._waiters = remaining


class Residency:
    """Loads, evicts and unloads the local runtimes registered with it."""

    def __init__(self, settings: Settings, ledger: Ledger | None = None) -> None:
        self.ledger = Ledger(settings.max_pending_requests) if ledger is None else ledger
        self._max_resident = settings.max_resident_providers
        self._idle_seconds = settings.provider_idle_unload_seconds
        self._slots: dict[str, _Slot] = {}
        self._queue: deque[tuple[_Slot, asyncio.Future[None], Claim]] = deque()
        self._lanes: dict[str, _Lane] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    def register(
        self, runtime: LocalRuntime, lane: str | None = None, group: str | None = None
    ) -> None:
        """`group` (default: the runtime's name) says who may hold `lane` together."""
        if runtime.name in self._slots:
            raise ValueError(f"runtime {runtime.name!r} is already registered")
        self._slots[runtime.name] = _Slot(runtime, lane, group or runtime.name)
        if lane is not None:
            self._lanes.setdefault(lane, _Lane())

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def loaded(self, name: str) -> bool:
        return self._slots[name].runtime.loaded

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._idle_seconds > 0 and self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_idle(), name="residency-idle-unload")

    async def close(self) -> None:
        """Refuse new decisions, fail queued ones, and unload every runtime."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        while self._queue:
            _, future, _ = self._queue.popleft()
            if not future.done():
                future.set_exception(ShuttingDown())
        transitions = [s.transition for s in self._slots.values() if s.transition is not None]
        await asyncio.gather(*transitions, return_exceptions=True)
        for slot in self._slots.values():
            if slot.runtime.loaded:
                metrics.PROVIDER_UNLOADS.inc(provider=slot.runtime.name, reason="shutdown")
        await asyncio.gather(
            *(s.runtime.unload() for s in self._slots.values()), return_exceptions=True
        )

    # -- decisions ---------------------------------------------------------------------------

    def batch_turns(self, runtimes: list[LocalRuntime]) -> list[list[LocalRuntime]]:
        """The turns in which one batch takes the local runtimes it names, loading each at most
        once: the resident ones first, then the others, as many at a time as there are slots (a
        later turn evicts only runtimes the batch is done with, or others by LRU)."""
        resident = [r for r in runtimes if self._slots[r.name].resident]
        ordered = resident + [r for r in runtimes if r not in resident]
        size = self._max_resident
        return [ordered[start : start + size] for start in range(0, len(ordered), size)]

    @contextlib.asynccontextmanager
    async def use(self, runtime: LocalRuntime) -> AsyncIterator[None]:
        """`runtime` loaded, and its lane, for one decision."""
        slot = self._slots[runtime.name]
        try:
            with self.ledger.claim(runtime.name) as claim:
                with tracing.span("queue.slot", provider=runtime.name):
                    await self._admit(slot, claim)
                lane = self._lanes.get(slot.lane) if slot.lane is not None else None
                if lane is None:
                    yield
                else:
                    with tracing.span("queue.lane", provider=runtime.name, lane=slot.lane or ""):
                        await lane.acquire(slot.group)
                    try:
                        yield
                    finally:
                        lane.release()
        finally:
            slot.last_used = time.monotonic()
            self._pump()

    async def _admit(self, slot: _Slot, claim: Claim) -> None:
        if self._closed:
            raise ShuttingDown()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((slot, future, claim))
        self._pump()
        await future

    def _pump(self) -> None:
        """Admit, load and evict as far as the queue allows: called on every state change."""
        index = 0
        while index < len(self._queue):
            slot, future, claim = self._queue[index]
            if future.done():
                del self._queue[index]
                continue
            if slot.ready:
                del self._queue[index]
                claim.hold()
                slot.last_used = time.monotonic()
                future.set_result(None)
                continue
            if slot.transition is not None:
                index += 1  # its load (or unload) is under way; those behind may pass
                continue
            resident = sum(s.resident for s in self._slots.values())
            if resident < self._max_resident:
                slot.transition = asyncio.create_task(self._switch(None, slot))
                index += 1
                continue
            victim = self._idle_victim()
            if victim is None:
                return  # strict FIFO from here: the runtimes holding slots drain first
            victim.transition = asyncio.create_task(self._switch(victim, slot))
            slot.transition = victim.transition
            index += 1

    def _idle_victim(self) -> _Slot | None:
        idle = [
            s for s in self._slots.values() if s.ready and not self.ledger.holding(s.runtime.name)
        ]
        return min(idle, key=lambda s: s.last_used, default=None)

    async def _switch(self, victim: _Slot | None, slot: _Slot) -> None:
        """A failure fails only `slot`'s waiters."""
        try:
            replacing = None
            if victim is not None:
                log.info("unloading %s to make room for %s", victim.runtime.name, slot.runtime.name)
                metrics.PROVIDER_UNLOADS.inc(provider=victim.runtime.name, reason="evicted")
                replacing = victim.runtime
            log.info("loading %s", slot.runtime.name)
            started = time.monotonic()
            try:
                await slot.runtime.load(replacing=replacing)
            finally:
                if victim is not None:
                    victim.transition = None
            metrics.PROVIDER_LOADS.inc(provider=slot.runtime.name, result="ok")
            metrics.PROVIDER_LOAD_DURATION.observe(
                time.monotonic() - started, provider=slot.runtime.name
            )
        except Exception as exc:
            metrics.PROVIDER_LOADS.inc(provider=slot.runtime.name, result="failed")
            error = exc if isinstance(exc, ProviderUnavailable) else ProviderUnavailable()
            if not isinstance(exc, ProviderUnavailable):
                log.exception("loading %s failed", slot.runtime.name)
            slot.transition = None
            for waiting, future, _ in list(self._queue):
                if waiting is slot and not future.done():
                    future.set_exception(error)
        finally:
            slot.transition = None
            self._pump()

    # -- unloading ---------------------------------------------------------------------------

    async def unload_all(self) -> list[UnloadedProvider]:
        """Unload every runtime, or none (ProviderBusy) while any decision waits or runs."""
        slots = list(self._slots.values())
        busy = self.ledger.waiting() or self.ledger.holding()
        if busy or any(s.transition is not None for s in slots):
            raise ProviderBusy()
        report = [UnloadedProvider(s.runtime.name, s.runtime.loaded) for s in slots]
        tasks = []
        for slot in slots:
            if slot.runtime.loaded:
                slot.transition = asyncio.create_task(self._unload(slot, "unload_all"))
                tasks.append(slot.transition)
        await asyncio.gather(*tasks)
        return report

    async def _unload(self, slot: _Slot, reason: str) -> None:
        metrics.PROVIDER_UNLOADS.inc(provider=slot.runtime.name, reason=reason)
        try:
            await slot.runtime.unload()
        finally:
            slot.transition = None
            self._pump()

    async def _reap_idle(self) -> None:
        interval = max(0.05, min(self._idle_seconds / 4, 1.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for slot in self._slots.values():
                name = slot.runtime.name
                if (
                    slot.ready
                    and not (self.ledger.holding(name) or self.ledger.waiting(name))
                    and now - slot.last_used >= self._idle_seconds
                ):
                    log.info(
                        "unloading %s after %.0f s idle", slot.runtime.name, self._idle_seconds
                    )
                    slot.transition = asyncio.create_task(self._unload(slot, "idle"))
