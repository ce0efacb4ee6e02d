"""ProcessRuntime over real worker processes running the torch-free test engine."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from decidealot import device, registry
from decidealot.config import ConfigError, Settings
from decidealot.contract import NoulQuestion
from decidealot.device import check_cuda, resolve_device
from decidealot.errors import ProviderBusy, ProviderUnavailable, RequestInvalid
from decidealot.jobs import EngineSpec, Job
from decidealot.providers.engine import client as local
from decidealot.providers.engine.client import ProcessRuntime
from decidealot.residency import Residency
from tests.support.engines.arith import answer, resident_bytes
from tests.support.ops_launcher import running

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class ResidentRunner:
    """A decision's way through residency to a runtime, as the executor takes it."""

    def __init__(self, runtime: ProcessRuntime, residency: Residency) -> None:
        self._runtime = runtime
        self._residency = residency

    async def run(self, job: Job) -> object:
        async with self._residency.use(self._runtime):
            return await self._runtime.submit(job)


def spec(log: Path | None = None, **options: object) -> EngineSpec:
    if log is not None:
        options["log"] = str(log)
    return EngineSpec(factory="tests.support.engines.arith:create", checkpoints={}, options=options)


def settings(**values: object) -> Settings:
    values.setdefault("max_request_tokens", 0)  # the arith engine counts state characters
    return registry.settings(device="cpu", **values)


def job(state: str, checkpoint: str = "ckpt", **config: object) -> Job:
    return Job(checkpoint, state, {"q": NoulQuestion()}, config=dict(config))


def pid_in(log: Path) -> int:
    """The process id of the worker that last started an engine logging to `log`."""
    return int(engine_starts(log)[-1]["start"])  # type: ignore[call-overload]


def passes(log: Path) -> list[dict[str, object]]:
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [record for record in records if "size" in record]


async def started_pass(log: Path, seconds: float = 30.0) -> None:
    """Wait until the arith engine has logged a pass (the worker is up, whatever the load)."""
    deadline = time.monotonic() + seconds
    while not (log.exists() and passes(log)):
        assert time.monotonic() < deadline, "no pass started"
        await asyncio.sleep(0.02)


async def within(awaitable: Awaitable[T], what: str, seconds: float = 30.0) -> T:
    """`awaitable`'s result; a hang guard, never the thing asserted: fails naming `what` if it
    has not come after `seconds`."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise AssertionError(f"{what}: still waiting after {seconds} s") from None


async def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not running(pid)


@pytest.fixture
async def runtime(tmp_path: Path):
    runtimes: list[ProcessRuntime] = []

    def make(spec_: EngineSpec | None = None, **values: object) -> ProcessRuntime:
        made = ProcessRuntime(
            f"arith{len(runtimes)}", spec_ or spec(tmp_path / "log"), settings(**values)
        )
        runtimes.append(made)
        return made

    yield make
    await asyncio.gather(*(each.unload() for each in runtimes))


async def test_answers_equal_the_engine_and_unload_ends_the_process(runtime, tmp_path) -> None:
    worker = runtime()
    assert not worker.loaded
    await worker.load()
    pid = pid_in(tmp_path / "log")
    assert worker.loaded and running(pid)
    each = job({"ticket": [1, 2.5, "x"]})
    assert await worker.submit(each) == answer(each)
    await worker.unload()
    assert not worker.loaded
    assert await wait_gone(pid, 1)
    await worker.unload()  # idempotent
    with pytest.raises(ProviderUnavailable):
        await worker.submit(each)


async def test_jobs_larger_than_the_pipes_buffers_cross_intact(runtime) -> None:
    worker = runtime()
    await worker.load()
    big = [job("x" * 3_000_000), job(list(range(200_000)))]
    assert await asyncio.gather(*(worker.submit(each) for each in big)) == [
        answer(each) for each in big
    ]


async def test_concurrent_jobs_share_passes_and_answer_as_alone(runtime, tmp_path) -> None:
    log = tmp_path / "log"
    worker = runtime()
    await worker.load()
    slow = asyncio.create_task(worker.submit(job("slow", sleep=1.0)))
    await started_pass(log)  # its pass runs: the eight queue behind it
    jobs = [job(f"state {i}" * (i + 1)) for i in range(8)]
    batched = await asyncio.gather(*(worker.submit(each) for each in jobs))
    await slow
    sizes = [record["size"] for record in passes(log)]
    assert sizes[0] == 1
    assert len(sizes) < 1 + len(jobs) and max(sizes[1:]) > 1, sizes
    alone = [await worker.submit(each) for each in jobs]
    assert batched == alone == [answer(each) for each in jobs]


async def test_the_token_budget_bounds_each_pass(runtime, tmp_path) -> None:
    worker = runtime(batch_token_budget=100)
    await worker.load()
    slow = asyncio.create_task(worker.submit(job("slow", sleep=1.0)))
    await started_pass(tmp_path / "log")
    await asyncio.gather(*(worker.submit(job(f"s{i}", cost=40)) for i in range(6)))
    await slow
    sizes = [record["size"] for record in passes(tmp_path / "log")]
    assert sizes == [1, 2, 2, 2]


async def test_jobs_of_other_checkpoints_run_in_their_own_passes(runtime, tmp_path) -> None:
    worker = runtime()
    await worker.load()
    slow = asyncio.create_task(worker.submit(job("slow", sleep=1.0)))
    await started_pass(tmp_path / "log")
    mixed = [job("a1", "a"), job("b1", "b"), job("a2", "a"), job("b2", "b")]
    assert await asyncio.gather(*(worker.submit(each) for each in mixed)) == [
        answer(each) for each in mixed
    ]
    await slow
    batches = [record["states"] for record in passes(tmp_path / "log")[1:]]
    assert batches == [["a1", "a2"], ["b1", "b2"]]


async def test_killed_worker_fails_in_flight_jobs_then_restarts(runtime, tmp_path) -> None:
    worker = runtime()
    await worker.load()
    pid = pid_in(tmp_path / "log")
    in_flight = [asyncio.create_task(worker.submit(job(f"s{i}", sleep=5))) for i in range(3)]
    await started_pass(tmp_path / "log")  # the worker holds them: a pass of theirs runs
    os.kill(pid, signal.SIGKILL)
    for task in in_flight:
        with pytest.raises(ProviderUnavailable) as failure:
            await task
        assert failure.value.status == 503
    assert not worker.loaded
    assert await wait_gone(pid, 1)
    await worker.load()
    assert pid_in(tmp_path / "log") != pid
    each = job("after the crash")
    assert await worker.submit(each) == answer(each)


async def test_a_crash_during_a_pass_fails_the_batch_not_the_next_request(
    runtime, tmp_path
) -> None:
    worker = runtime()
    await worker.load()
    pid = pid_in(tmp_path / "log")
    with pytest.raises(ProviderUnavailable):
        await worker.submit(job("boom", crash="run"))
    assert not worker.loaded
    assert await wait_gone(pid, 1)
    await worker.load()
    assert await worker.submit(job("ok")) == answer(job("ok"))


async def test_a_hung_pass_times_out_and_the_worker_is_killed(runtime, tmp_path) -> None:
    worker = runtime(provider_timeout_seconds=0.5)
    await worker.load()
    pid = pid_in(tmp_path / "log")
    stuck = asyncio.create_task(worker.submit(job("stuck", hang=True)))  # an hour's pass
    await started_pass(tmp_path / "log")
    queued = asyncio.create_task(worker.submit(job("queued behind it")))
    for task in (stuck, queued):
        with pytest.raises(ProviderUnavailable, match="timed out"):
            await within(task, "the watchdog's 0.5 s timeout")
    assert not worker.loaded
    assert await wait_gone(pid, 1)
    await worker.load()
    assert await worker.submit(job("ok")) == answer(job("ok"))


async def test_a_long_queue_that_keeps_answering_does_not_time_out(runtime) -> None:
    worker = runtime(provider_timeout_seconds=1.0)
    await worker.load()
    jobs = [job(name, name, sleep=0.45) for name in ("a", "b", "c")]  # three separate passes
    assert await asyncio.gather(*(worker.submit(each) for each in jobs)) == [
        answer(each) for each in jobs
    ]


async def test_input_errors_come_back_as_decision_input_errors(runtime, tmp_path) -> None:
    worker = runtime()
    await worker.load()
    pid = pid_in(tmp_path / "log")
    for stage in ("prepare", "run"):
        with pytest.raises(RequestInvalid) as failure:
            await worker.submit(job("x", input_error=stage))
        (issue,) = failure.value.issues
        assert issue.loc == ["questions", "q", "criteria"]
        assert issue.msg == f"cannot take this at {stage}"
    assert pid_in(tmp_path / "log") == pid


async def test_a_job_msgpack_cannot_carry_is_refused_without_touching_the_worker(
    runtime, tmp_path
) -> None:
    worker = runtime()
    await worker.load()
    pid = pid_in(tmp_path / "log")
    with pytest.raises(ProviderUnavailable):
        await worker.submit(job({"n": 2**70}))
    assert pid_in(tmp_path / "log") == pid
    assert await worker.submit(job("ok")) == answer(job("ok"))


async def test_an_engine_bug_fails_only_that_job_without_leaking_it(
    runtime, tmp_path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    worker = runtime()
    await worker.load()
    pid = pid_in(tmp_path / "log")
    with pytest.raises(ProviderUnavailable) as failure:
        await worker.submit(job("private", fail="run"))
    assert "private" not in str(failure.value) and "secret" not in str(failure.value)
    assert pid_in(tmp_path / "log") == pid
    assert await worker.submit(job("next")) == answer(job("next"))
    await worker.unload()
    assert "RuntimeError" in caplog.text
    assert "private" not in caplog.text and "secret" not in caplog.text


async def test_a_failing_factory_is_unavailable_with_a_safe_message(runtime, caplog) -> None:
    worker = runtime(spec(fail_start=True))
    with pytest.raises(ProviderUnavailable) as failure:
        await worker.load()
    assert str(failure.value) == local.START_FAILED
    assert failure.value.status == 503 and failure.value.code == "PROVIDER_UNAVAILABLE"
    assert not worker.loaded
    assert "FileNotFoundError" in caplog.text  # the operator learns why from the log


async def test_a_slow_start_times_out_and_is_killed(runtime, caplog) -> None:
    caplog.set_level(logging.INFO)
    worker = runtime(spec(start_delay=30), provider_start_timeout_seconds=0.5)
    with pytest.raises(ProviderUnavailable, match="could not start"):
        await within(worker.load(), "the 0.5 s start timeout", seconds=20)  # before the 30 s
    pid = int(caplog.text.split("starting worker (pid ")[1].split(")")[0])
    assert await wait_gone(pid, 1)


@pytest.mark.parametrize("python", ["/bin/false", "/nonexistent/python"])
async def test_a_worker_that_cannot_run_is_unavailable(runtime, python: str) -> None:
    worker = runtime(worker_python=Path(python))
    with pytest.raises(ProviderUnavailable, match="could not start"):
        await worker.load()
    assert not worker.loaded


async def test_settings_reach_the_worker_but_keys_do_not(runtime, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DECIDEALOT_API_KEY", "gateway-key")
    worker = runtime(torch_threads=3)
    await worker.load()
    start = json.loads((tmp_path / "log").read_text().splitlines()[0])
    assert start["device"] == "cpu"
    assert start["omp_threads"] == "3"
    assert start["inherited_keys"] == []


# -- device ----------------------------------------------------------------------------------


@pytest.fixture
def driver_files(tmp_path, monkeypatch):
    device._probe_cuda.cache_clear()
    device._resolve_auto.cache_clear()
    marker = tmp_path / "nvidia-version"
    monkeypatch.setattr(device, "_NVIDIA_DRIVER_FILES", (marker,))
    yield marker
    device._probe_cuda.cache_clear()
    device._resolve_auto.cache_clear()


def test_an_explicit_device_is_kept() -> None:
    assert resolve_device(registry.settings(device="cuda")) == "cuda"
    assert resolve_device(registry.settings(device="cpu")) == "cpu"


@pytest.mark.parametrize("driver", [False, True])
def test_cuda_where_torch_sees_no_gpu_names_the_setting(driver_files, tmp_path, driver) -> None:
    if driver:
        driver_files.write_text("NVRM version: test")
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho cpu\n")
    python.chmod(0o755)
    check_cuda(registry.settings(device="cpu", worker_python=python))
    with pytest.raises(ConfigError, match=r"DECIDEALOT_DEVICE=cuda: .* sees no CUDA device"):
        check_cuda(registry.settings(device="cuda", worker_python=python))
    driver_files.write_text("NVRM version: test")
    python.write_text("#!/bin/sh\necho cuda\n")
    device._probe_cuda.cache_clear()
    check_cuda(registry.settings(device="cuda", worker_python=python))  # a GPU torch sees: fine


def test_auto_is_cpu_without_an_nvidia_driver(driver_files, monkeypatch) -> None:
    def no_probe(*args: object, **kwargs: object) -> None:
        raise AssertionError("probed torch without a driver")

    monkeypatch.setattr(subprocess, "run", no_probe)
    assert resolve_device(registry.settings(device="auto")) == "cpu"


@pytest.mark.parametrize("says, expected", [("cuda", "cuda"), ("cpu", "cpu"), ("", "cpu")])
def test_auto_asks_the_worker_interpreter_when_a_driver_is_present(
    driver_files, tmp_path, says: str, expected: str
) -> None:
    driver_files.write_text("NVRM version: test")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {says}\n")
    python.chmod(0o755)
    assert resolve_device(registry.settings(device="auto", worker_python=python)) == expected


# -- residency -------------------------------------------------------------------------------


async def test_idle_unload_ends_the_worker(runtime, tmp_path) -> None:
    residency = Residency(settings(provider_idle_unload_seconds=0.3))
    worker = runtime()
    residency.register(worker, lane=None)
    await residency.start()
    try:
        assert await ResidentRunner(worker, residency).run(job("x")) == answer(job("x"))
        pid = pid_in(tmp_path / "log")
        assert await wait_gone(pid, 3)
        assert not worker.loaded
    finally:
        await residency.close()


async def test_after_a_crash_the_next_decision_starts_a_new_worker(runtime, tmp_path) -> None:
    residency = Residency(settings(provider_idle_unload_seconds=0))
    worker = runtime()
    residency.register(worker, lane=None)
    runner = ResidentRunner(worker, residency)
    try:
        in_flight = asyncio.create_task(runner.run(job("slow", sleep=5)))
        await started_pass(tmp_path / "log")
        pid = pid_in(tmp_path / "log")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ProviderUnavailable):
            await in_flight
        assert await runner.run(job("next")) == answer(job("next"))
        assert pid_in(tmp_path / "log") != pid
    finally:
        await residency.close()


async def test_one_slot_switches_between_runtimes_lru(runtime, tmp_path) -> None:
    residency = Residency(settings(max_resident_providers=1, provider_idle_unload_seconds=0))
    first, second = runtime(spec(tmp_path / "first")), runtime(spec(tmp_path / "second"))
    for each in (first, second):
        residency.register(each, lane=None)
    runners = {each: ResidentRunner(each, residency) for each in (first, second)}
    try:
        assert await runners[first].run(job("1")) == answer(job("1"))
        first_pid = pid_in(tmp_path / "first")
        jobs = [(second, job("2", sleep=0.2)), (first, job("3")), (second, job("4"))]
        results = await asyncio.gather(*(runners[each].run(j) for each, j in jobs))
        assert results == [answer(j) for _, j in jobs]
        assert not (first.loaded and second.loaded)
        assert (
            second.loaded and pid_in(tmp_path / "second") == first_pid
        )  # every switch reused the one process
        starts = [json.loads(line) for line in (tmp_path / "first").read_text().splitlines()]
        assert [r["start"] for r in starts if "start" in r] == [first_pid] * 2  # out, then back
    finally:
        await residency.close()
    assert not first.loaded and not second.loaded
    assert await wait_gone(first_pid, 5)


def engine_starts(log: Path) -> list[dict[str, object]]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if "start" in r]


async def switch(residency: Residency, runtime_: ProcessRuntime, each: Job) -> object:
    return await ResidentRunner(runtime_, residency).run(each)


async def test_a_switch_swaps_the_engine_in_place_and_returns_the_old_ones_memory(
    runtime, tmp_path
) -> None:
    """Each engine holds 300 MB in small heap blocks, as a model's tensors do. After each
    switch the one worker holds one engine's worth: the old engine's memory went back to the
    system before the new engine was built (its start sees the worker's bare size)."""
    residency = Residency(settings(max_resident_providers=1, provider_idle_unload_seconds=0))
    logs = {name: tmp_path / name for name in ("first", "second")}
    first = runtime(spec(logs["first"], hold_mb=300))
    second = runtime(spec(logs["second"], hold_mb=300))
    for each in (first, second):
        residency.register(each, lane=None)
    try:
        await switch(residency, first, job("1"))
        pid = pid_in(logs["first"])
        loaded = resident_bytes(pid)
        for target in (second, first, second):
            assert await switch(residency, target, job("x")) == answer(job("x"))
            assert pid_in(logs["first" if target is first else "second"]) == pid and not (
                first.loaded and second.loaded
            )
            assert resident_bytes(pid) < loaded + 100e6  # not two engines' worth (+300 MB)
        bare = engine_starts(logs["first"])[0]["rss"]
        for start in engine_starts(logs["first"])[1:] + engine_starts(logs["second"]):
            assert start["start"] == pid
            assert start["rss"] < bare + 100e6  # nothing of the previous engine left  # type: ignore[operator]
    finally:
        await residency.close()
    assert await wait_gone(pid, 5)


async def test_a_crash_after_a_swap_is_a_503_and_the_next_decision_recovers(
    runtime, tmp_path
) -> None:
    residency = Residency(settings(max_resident_providers=1, provider_idle_unload_seconds=0))
    first, second = runtime(spec(tmp_path / "first")), runtime(spec(tmp_path / "second"))
    for each in (first, second):
        residency.register(each, lane=None)
    try:
        await switch(residency, first, job("1"))
        pid = pid_in(tmp_path / "first")
        with pytest.raises(ProviderUnavailable) as failure:
            await switch(residency, second, job("boom", crash="run"))  # in the swapped worker
        assert failure.value.status == 503
        assert not second.loaded and not first.loaded
        assert await wait_gone(pid, 5)
        assert await switch(residency, second, job("2")) == answer(job("2"))
        assert pid_in(tmp_path / "second") != pid
        assert await switch(residency, first, job("3")) == answer(job("3"))
    finally:
        await residency.close()


async def test_a_failed_engine_start_after_a_swap_ends_the_worker(runtime, tmp_path) -> None:
    residency = Residency(settings(max_resident_providers=1, provider_idle_unload_seconds=0))
    first = runtime(spec(tmp_path / "first"))
    broken = runtime(spec(tmp_path / "broken", fail_start=True))
    for each in (first, broken):
        residency.register(each, lane=None)
    try:
        await switch(residency, first, job("1"))
        pid = pid_in(tmp_path / "first")
        with pytest.raises(ProviderUnavailable):
            await switch(residency, broken, job("2"))
        assert not first.loaded and not broken.loaded
        assert await wait_gone(pid, 5)
        assert await switch(residency, first, job("3")) == answer(job("3"))
        assert pid_in(tmp_path / "first") != pid
    finally:
        await residency.close()


async def test_a_worker_that_cannot_release_in_time_is_killed_and_replaced(
    runtime, tmp_path, monkeypatch
) -> None:
    """A withdrawn job's pass runs on; one that hangs keeps the worker from releasing."""
    monkeypatch.setattr(local, "EXIT_GRACE_SECONDS", 0.5)
    residency = Residency(settings(max_resident_providers=1, provider_idle_unload_seconds=0))
    first, second = runtime(spec(tmp_path / "first")), runtime(spec(tmp_path / "second"))
    for each in (first, second):
        residency.register(each, lane=None)
    try:
        hung = asyncio.create_task(switch(residency, first, job("hang", hang=True)))
        await started_pass(tmp_path / "first")
        pid = pid_in(tmp_path / "first")
        hung.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hung
        assert await switch(residency, second, job("2")) == answer(job("2"))
        assert await wait_gone(pid, 5)
        assert pid_in(tmp_path / "second") != pid
    finally:
        await residency.close()


async def test_unload_while_busy_is_refused_then_ends_the_worker(runtime, tmp_path) -> None:
    residency = Residency(settings(provider_idle_unload_seconds=0))
    worker = runtime()
    residency.register(worker, lane=None)
    runner = ResidentRunner(worker, residency)
    try:
        busy = asyncio.create_task(runner.run(job("slow", sleep=0.5)))
        await started_pass(tmp_path / "log")
        pid = pid_in(tmp_path / "log")
        with pytest.raises(ProviderBusy):
            await residency.unload_all()
        assert pid_in(tmp_path / "log") == pid
        assert await busy == answer(job("slow", sleep=0.5))
        report = await residency.unload_all()
        assert [(each.name, each.was_loaded) for each in report] == [(worker.name, True)]
        assert await wait_gone(pid, 1)
    finally:
        await residency.close()


async def test_decisions_through_residency_still_share_passes(runtime, tmp_path) -> None:
    residency = Residency(settings(provider_idle_unload_seconds=0))
    worker = runtime()
    residency.register(worker, lane="cuda")
    runner = ResidentRunner(worker, residency)
    try:
        slow = asyncio.create_task(runner.run(job("slow", sleep=1.0)))
        await started_pass(tmp_path / "log")  # its pass runs: the five queue behind it
        await asyncio.gather(*(runner.run(job(f"s{i}")) for i in range(5)))
        await slow
    finally:
        await residency.close()
    assert [record["size"] for record in passes(tmp_path / "log")] == [1, 5]


# -- the gateway process ---------------------------------------------------------------------

PARENT = """
import asyncio, json, sys
from pathlib import Path
from decidealot import registry
from decidealot.contract import NoulQuestion
from decidealot.jobs import EngineSpec, Job
from decidealot.providers.engine.client import ProcessRuntime

async def main():
    log = Path(sys.argv[2])
    spec = EngineSpec(
        factory="tests.support.engines.arith:create", checkpoints={}, options={"log": str(log)}
    )
    worker = ProcessRuntime("arith", spec, registry.settings(device="cpu"))
    await worker.load()
    pid = json.loads(log.read_text().splitlines()[0])["start"]
    if sys.argv[1] == "busy":
        asyncio.create_task(worker.submit(Job("c", "s", {"q": NoulQuestion()}, {"hang": True})))
        while '"size"' not in log.read_text():  # until its pass has begun
            await asyncio.sleep(0.02)
    print(pid, flush=True)
    await asyncio.sleep(60)  # alive until the test kills it

asyncio.run(main())
"""


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
@pytest.mark.parametrize(
    "kill, state", [(signal.SIGKILL, "idle"), (signal.SIGKILL, "busy"), (signal.SIGTERM, "busy")]
)
async def test_workers_do_not_outlive_their_gateway(tmp_path, kill, state) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        state,
        str(tmp_path / "log"),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert parent.stdout is not None
    line = await asyncio.wait_for(parent.stdout.readline(), 20)
    worker_pid = int(line)
    assert running(worker_pid)
    parent.send_signal(kill)
    await parent.wait()
    assert await wait_gone(worker_pid, 5)


GATEWAY_MODULES = [
    "decidealot.config",
    "decidealot.residency",
    "decidealot.executor",
    "decidealot.service",
    "decidealot.http",
    "decidealot.mcp",
    "decidealot.cli",
    "decidealot.providers.engine.client",
    "decidealot.providers.engine.protocol",
    "decidealot.providers.laya.gateway.provider",
    "decidealot.providers.von.gateway.provider",
    "decidealot.providers.clm.gateway.provider",
    "decidealot.providers.jev.gateway.provider",
]

NO_TORCH = """
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if not name.startswith(missing.name or "?"):
            raise
from decidealot import registry
from decidealot.device import resolve_device
resolve_device(registry.settings())
heavy = sorted(m for m in ("torch", "transformers", "safetensors") if m in sys.modules)
print(",".join(heavy) or "none")
"""


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
def test_the_gateway_never_imports_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH, *GATEWAY_MODULES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "none"


def test_token_budget_follows_the_device_unless_set() -> None:
    from decidealot.config import ConfigError
    from decidealot.device import token_budget

    assert token_budget(registry.settings(), "cpu") == 4096
    assert token_budget(registry.settings(), "cuda") == 32768
    assert token_budget(registry.settings(batch_token_budget=1000), "cuda") == 1000
    assert registry.from_env({"DECIDEALOT_BATCH_TOKEN_BUDGET": "0"}).batch_token_budget == 0
    with pytest.raises(ConfigError, match="DECIDEALOT_BATCH_TOKEN_BUDGET"):
        registry.from_env({"DECIDEALOT_BATCH_TOKEN_BUDGET": "100"})


def test_concurrent_passes_fill_the_cores_on_cpu_and_stay_serial_on_cuda(monkeypatch) -> None:
    from decidealot.device import concurrent_passes

    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert concurrent_passes(registry.settings(torch_threads=1), "cpu") == 8
    assert concurrent_passes(registry.settings(torch_threads=2), "cpu") == 4
    assert concurrent_passes(registry.settings(torch_threads=3), "cpu") == 2
    assert concurrent_passes(registry.settings(torch_threads=16), "cpu") == 1
    assert (
        concurrent_passes(registry.settings(), "cpu") == 1
    )  # torch's default threads use every core
    assert concurrent_passes(registry.settings(torch_threads=1), "cuda") == 1
    assert concurrent_passes(registry.settings(torch_threads=1, worker_passes=3), "cpu") == 3
    assert concurrent_passes(registry.settings(worker_passes=2), "cuda") == 2


def test_worker_passes_setting_is_validated() -> None:
    from decidealot.config import ConfigError

    assert registry.from_env({}).worker_passes == 0
    assert registry.from_env({"DECIDEALOT_WORKER_PASSES": "64"}).worker_passes == 64
    for bad in ("-1", "65", "two"):
        with pytest.raises(ConfigError, match="DECIDEALOT_WORKER_PASSES") as raised:
            registry.from_env({"DECIDEALOT_WORKER_PASSES": bad})
        assert "\n" not in str(raised.value)


async def test_a_worker_with_two_passes_runs_them_at_once(runtime, tmp_path) -> None:
    worker = runtime(worker_passes=2)
    await worker.load()
    gate = tmp_path / "gate"
    held, other = job("held", until=str(gate)), job("other")
    first = asyncio.create_task(worker.submit(held))
    await started_pass(tmp_path / "log")  # the first pass is under way: the second cannot join
    # the second is answered on the other compute thread while the first one's pass is held
    assert await within(worker.submit(other), "a second pass beside a held one") == answer(other)
    assert not first.done()
    gate.touch()
    assert await first == answer(held)
