"""Residency rules on in-memory runtimes: slots, LRU eviction, FIFO turns, lanes, unload."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from decidealot import registry
from decidealot.errors import ProviderBusy, ProviderUnavailable
from decidealot.residency import Residency


class FakeRuntime:
    def __init__(self, name: str, log: list[str], load_seconds: float = 0.0) -> None:
        self.name = name
        self._loaded = False
        self._log = log
        self._load_seconds = load_seconds
        self.fail_next_load = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    async def load(self, replacing: object = None) -> None:
        if replacing is not None:
            await replacing.unload()  # type: ignore[attr-defined]
        await asyncio.sleep(self._load_seconds)
        if self.fail_next_load:
            self.fail_next_load = False
            raise ProviderUnavailable()
        self._log.append(f"load {self.name}")
        self._loaded = True

    async def unload(self) -> None:
        if self._loaded:
            self._log.append(f"unload {self.name}")
        self._loaded = False

    def crash(self) -> None:
        self._loaded = False


def make(max_resident: int = 1, idle: float = 0.0, lanes: dict[str, str] | None = None):
    log: list[str] = []
    residency = Residency(
        registry.settings(max_resident_providers=max_resident, provider_idle_unload_seconds=idle)
    )
    runtimes = {name: FakeRuntime(name, log) for name in ("laya", "von", "clm")}
    for name, runtime in runtimes.items():
        residency.register(runtime, lane=(lanes or {}).get(name))
    return residency, runtimes, log


async def until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    """Poll `condition` every 10 ms; `seconds` only guards against a hang, failing on `what`."""
    try:
        async with asyncio.timeout(seconds):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"never {what} in {seconds} s") from None


async def decide(residency: Residency, runtime: FakeRuntime, trace: list[str], seconds=0.01):
    async with residency.use(runtime):
        assert runtime.loaded
        trace.append(f"start {runtime.name}")
        await asyncio.sleep(seconds)
        trace.append(f"end {runtime.name}")


async def test_one_slot_switches_and_never_overlaps():
    residency, rt, log = make(max_resident=1)
    trace: list[str] = []
    order = [rt["laya"], rt["von"], rt["laya"], rt["von"], rt["laya"]]
    await asyncio.gather(*(decide(residency, r, trace) for r in order))
    # never two different runtimes loaded at once
    loaded: set[str] = set()
    for entry in log:
        verb, name = entry.split()
        if verb == "load":
            assert not loaded, log
            loaded.add(name)
        else:
            loaded.discard(name)
    assert trace.count("start laya") == 3 and trace.count("start von") == 2
    # FIFO turns: laya batch, von batch, then the remaining laya
    assert log[:3] == ["load laya", "unload laya", "load von"]


async def test_two_slots_overlap_and_lru_eviction():
    residency, rt, log = make(max_resident=2)
    trace: list[str] = []
    await asyncio.gather(decide(residency, rt["laya"], trace), decide(residency, rt["von"], trace))
    assert trace.index("start von") < trace.index("end laya")  # overlapped
    await decide(residency, rt["laya"], trace)  # von is now least recently used
    await decide(residency, rt["clm"], trace)
    assert log[-2:] == ["unload von", "load clm"]
    assert rt["laya"].loaded and rt["clm"].loaded and not rt["von"].loaded


async def test_lane_serialises_different_runtimes_but_not_one_runtime():
    residency, rt, _ = make(max_resident=3, lanes={"laya": "cuda", "von": "cuda"})
    trace: list[str] = []
    await asyncio.gather(
        decide(residency, rt["laya"], trace, 0.05),
        decide(residency, rt["laya"], trace, 0.05),
        decide(residency, rt["von"], trace, 0.05),
    )
    assert trace[:2] == ["start laya", "start laya"]
    assert trace.index("start von") > max(i for i, t in enumerate(trace) if t == "end laya")


async def test_unload_all_reports_and_refuses_while_busy():
    residency, rt, _ = make(max_resident=2)
    await decide(residency, rt["laya"], [])
    entered, gate = asyncio.Event(), asyncio.Event()

    async def busy():
        async with residency.use(rt["von"]):
            entered.set()
            await gate.wait()

    task = asyncio.create_task(busy())
    await entered.wait()
    with pytest.raises(ProviderBusy):
        await residency.unload_all()
    assert rt["laya"].loaded and rt["von"].loaded  # released none
    gate.set()
    await task
    report = await residency.unload_all()
    assert [(p.name, p.was_loaded) for p in report] == [
        ("laya", True),
        ("von", True),
        ("clm", False),
    ]
    again = await residency.unload_all()
    assert all(not p.was_loaded for p in again)


async def test_idle_unload_and_reload_after_crash():
    residency, rt, log = make(max_resident=1, idle=0.1)
    await residency.start()
    try:
        await decide(residency, rt["laya"], [])
        await until(lambda: not rt["laya"].loaded, "the idle runtime unloaded")
        assert log[-1] == "unload laya"
        await decide(residency, rt["laya"], [])
        rt["laya"].crash()
        await decide(residency, rt["laya"], [])  # started again on the next request
        assert log.count("load laya") == 3
    finally:
        await residency.close()


async def test_failed_load_fails_waiters_then_recovers():
    residency, rt, _ = make(max_resident=1)
    rt["von"].fail_next_load = True
    with pytest.raises(ProviderUnavailable):
        await decide(residency, rt["von"], [])
    await decide(residency, rt["von"], [])
    assert rt["von"].loaded


async def test_cancelled_waiter_does_not_leak_a_slot():
    residency, rt, _ = make(max_resident=1)
    entered, gate = asyncio.Event(), asyncio.Event()

    async def hold():
        async with residency.use(rt["laya"]):
            entered.set()
            await gate.wait()

    holder = asyncio.create_task(hold())
    await entered.wait()
    waiter = asyncio.create_task(decide(residency, rt["von"], []))
    await asyncio.sleep(0)  # one step: the waiter runs to its queued admission
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.set()
    await holder
    assert residency.ledger.holding() == 0
    await asyncio.wait_for(decide(residency, rt["von"], []), 1)


async def test_closed_residency_refuses():
    residency, rt, _ = make()
    await residency.close()
    with pytest.raises(ProviderUnavailable):
        await decide(residency, rt["laya"], [])


async def test_lane_groups_overlap_within_and_exclude_across():
    """CPU lanes: Laya and Von (one group) overlap; CLM (another group) overlaps neither."""
    log: list[str] = []
    residency = Residency(registry.settings(max_resident_providers=3))
    rt = {name: FakeRuntime(name, log) for name in ("laya", "von", "clm")}
    residency.register(rt["laya"], "local", "models")
    residency.register(rt["von"], "local", "models")
    residency.register(rt["clm"], "local", "clm")
    trace: list[str] = []
    await asyncio.gather(
        decide(residency, rt["laya"], trace, 0.05),
        decide(residency, rt["von"], trace, 0.05),
        decide(residency, rt["clm"], trace, 0.05),
    )
    assert trace[:2] == ["start laya", "start von"]
    assert trace.index("start clm") > max(trace.index("end laya"), trace.index("end von"))


async def test_a_lane_waiter_cancelled_as_the_lane_frees_neither_raises_nor_loses_it():
    from decidealot.residency import _Lane

    lane = _Lane()
    await lane.acquire("a")
    waiter = asyncio.create_task(lane.acquire("b"))
    await asyncio.sleep(0)  # the waiter is queued
    waiter.cancel()  # its future is cancelled; its except block has not run yet
    lane.release()  # drops the cancelled waiter from the queue before that block runs
    with pytest.raises(asyncio.CancelledError):
        await waiter  # not ValueError from removing a waiter release() already dropped
    await asyncio.wait_for(lane.acquire("c"), 1)  # the lane is free
    lane.release()


async def test_a_lane_handed_to_a_waiter_being_cancelled_is_given_back():
    from decidealot.residency import _Lane

    lane = _Lane()
    await lane.acquire("a")
    waiter = asyncio.create_task(lane.acquire("b"))
    await asyncio.sleep(0)
    lane.release()  # hands the lane to the waiter...
    waiter.cancel()  # ...which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(lane.acquire("c"), 1)  # it gave the lane back
    lane.release()


async def test_a_batch_takes_the_resident_runtimes_first_and_no_more_than_fit():
    residency, rt, _ = make(max_resident=2)
    await decide(residency, rt["clm"], [])
    batch = [rt["laya"], rt["von"], rt["clm"]]
    assert residency.batch_turns(batch) == [[rt["clm"], rt["laya"]], [rt["von"]]]
    one, rt1, _ = make(max_resident=1)
    assert one.batch_turns([rt1["von"], rt1["laya"]]) == [[rt1["von"]], [rt1["laya"]]]
