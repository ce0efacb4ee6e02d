"""`WorkerClient` without a process: a scripted link stands in for the worker's pipes, so each
state, answer and watchdog rule is driven frame by frame. tests/worker/test_runtime.py runs the
same client over real worker processes; tests/e2e/test_frozen_worker.py over a real server."""

from __future__ import annotations

import asyncio
import logging

import pytest

from decidealot import metrics, registry
from decidealot.contract import NoulQuestion
from decidealot.errors import ProviderUnavailable
from decidealot.jobs import CheckpointLoad, Decision, EngineSpec, Job
from decidealot.providers.engine.client import TIMED_OUT, State, WorkerClient
from decidealot.providers.engine.protocol import (
    FromWorker,
    Heartbeat,
    JobFailed,
    Loaded,
    PassDone,
    Ready,
    Released,
    Result,
    Start,
    Submit,
    ToWorker,
    decode_to_worker,
    encode,
)

GAUGE = "decidealot_int8_linear_share"
LOG = logging.getLogger("decidealot.runtime.test")


class ScriptedLink:
    """A worker that says what the test tells it to (`say`), and records what it was sent."""

    pid = 4242
    stderr = None

    def __init__(self) -> None:
        self.sent: list[ToWorker] = []
        self.killed = False
        self.cpu = False
        """What `moving` answers: whether the worker uses CPU."""
        self.checks = 0
        """How often the watchdog asked `moving`."""
        self._frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._received = asyncio.Event()

    def say(self, frame: FromWorker) -> None:
        self._frames.put_nowait(encode(frame)[4:])

    async def heard(self, kind: type) -> ToWorker:
        """The first frame of `kind` the client sent (waiting for it)."""
        while not any(isinstance(frame, kind) for frame in self.sent):
            self._received.clear()
            await asyncio.wait_for(self._received.wait(), 5)
        return next(frame for frame in self.sent if isinstance(frame, kind))

    async def send(self, frame: bytes) -> None:
        self.sent.append(decode_to_worker(frame[4:]))
        self._received.set()

    async def receive(self) -> bytes | None:
        return await self._frames.get()

    def kill(self) -> None:
        self.killed = True
        self._frames.put_nowait(None)

    async def wait(self) -> int:
        return -9 if self.killed else 0

    async def close(self, kill: bool) -> None:
        self._frames.put_nowait(None)

    def moving(self) -> bool:
        self.checks += 1
        return self.cpu


def start(timeout: float = 30.0) -> Start:
    spec = EngineSpec("tests.support.engines.arith:create", {})
    return Start(spec, 4096, heartbeat_seconds=timeout / 4)


async def ready(timeout: float = 30.0) -> tuple[WorkerClient, ScriptedLink]:
    """A client whose worker has built its engine, under a pass timeout of `timeout` s."""
    link = ScriptedLink()
    settings = registry.settings(device="cpu", provider_timeout_seconds=timeout)
    client = WorkerClient(link, settings, LOG)
    starting = asyncio.create_task(client.start(start(timeout), "scripted", LOG))
    await link.heard(Start)
    assert client.state is State.STARTING
    link.say(Ready("cpu"))
    await starting
    assert client.state is State.READY
    return client, link


def job(state: str = "x") -> Job:
    return Job("ckpt", state, {"q": NoulQuestion()})


async def until(condition, what: str, seconds: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """A hang guard only: fails naming `what` if `condition()` is not true by then."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


def share(checkpoint: str) -> float | None:
    labels = {"provider": "scripted", "checkpoint": checkpoint}
    return metrics.REGISTRY.get_sample_value(GAUGE, labels)


def loaded(checkpoint: str, int8_layers: int) -> Loaded:
    return Loaded(CheckpointLoad(checkpoint, f"/m/{checkpoint}", "int8", 4, int8_layers))


async def test_answers_find_their_jobs_by_id() -> None:
    client, link = await ready()
    first = asyncio.create_task(client.submit(job("a")))
    second = asyncio.create_task(client.submit(job("b")))
    await until(lambda: len(link.sent) == 3, "both jobs sent")
    ids = {frame.job.state: frame.id for frame in link.sent if isinstance(frame, Submit)}
    link.say(JobFailed(ids["b"], "RuntimeError"))
    link.say(Result(ids["a"], Decision("ckpt", {}, 1)))
    assert (await first).input_tokens == 1
    with pytest.raises(ProviderUnavailable):
        await asyncio.wait_for(second, 10)  # a hang guard
    await client.stop()


async def test_a_release_fails_the_engines_jobs_and_removes_its_gauges() -> None:
    """The engine's end removes the gauges of every checkpoint it reported (so `/metrics` names
    no checkpoint that is not loaded) and fails its jobs; a `Loaded` that still arrives (a
    dying engine's last words) sets none. The client, and its process, stay for the next."""
    client, link = await ready()
    link.say(loaded("first", 4))
    link.say(loaded("second", 2))
    await until(lambda: len(client.loads) == 2, "both loads reported")
    assert (share("first"), share("second")) == (1.0, 0.5)
    waiting = asyncio.create_task(client.submit(job()))
    await link.heard(Submit)
    releasing = asyncio.create_task(client.release())
    with pytest.raises(ProviderUnavailable):
        await asyncio.wait_for(waiting, 10)  # a hang guard
    link.say(loaded("third", 4))
    link.say(Released(1_000_000))
    assert await releasing
    assert client.state is State.SPARE and client.loads == {}
    assert (share("first"), share("second"), share("third")) == (None, None, None)
    await client.stop()


async def test_a_worker_that_exits_is_lost_and_fails_its_jobs() -> None:
    client, link = await ready()
    waiting = asyncio.create_task(client.submit(job()))
    await link.heard(Submit)
    link.kill()  # its stdout ends
    with pytest.raises(ProviderUnavailable):
        await asyncio.wait_for(waiting, 10)  # a hang guard
    assert client.state is State.LOST


async def test_garbage_from_a_worker_loses_it() -> None:
    client, link = await ready()
    link.say(Ready("cpu"))  # nobody asked
    await until(lambda: client.state is State.LOST, "the worker lost")
    assert link.killed


async def test_a_pass_past_the_timeout_loses_the_worker() -> None:
    client, link = await ready(timeout=0.2)
    waiting = asyncio.create_task(client.submit(job()))
    await link.heard(Submit)
    link.say(Heartbeat(passes={0: 0.25}))  # its pass has run longer than the pass timeout
    with pytest.raises(ProviderUnavailable, match=TIMED_OUT):
        await asyncio.wait_for(waiting, 10)  # a hang guard
    assert client.state is State.LOST and link.killed


async def test_silence_with_work_waiting_and_no_cpu_is_a_stall() -> None:
    """No pass begun, no frame, no heartbeat, no CPU: stalled, between passes or anywhere."""
    client, link = await ready(timeout=0.2)
    waiting = asyncio.create_task(client.submit(job()))
    with pytest.raises(ProviderUnavailable, match=TIMED_OUT):
        await asyncio.wait_for(waiting, 10)  # a hang guard
    assert client.state is State.LOST and link.killed


async def test_silence_while_the_worker_uses_cpu_is_not_a_stall() -> None:
    """A worker can go quiet with its CPU busy (torch's import holds the GIL for a second):
    that is not a stall. Once it stops using CPU, it is."""
    client, link = await ready(timeout=0.2)
    link.cpu = True
    waiting = asyncio.create_task(client.submit(job()))
    await until(lambda: link.checks >= 5, "the watchdog asked five times")
    assert client.state is State.READY and not waiting.done()
    link.cpu = False
    with pytest.raises(ProviderUnavailable, match=TIMED_OUT):
        await asyncio.wait_for(waiting, 10)  # a hang guard


async def test_heartbeats_keep_a_long_prepare_alive_up_to_the_start_timeout() -> None:
    """A job's prepare may load a checkpoint: it gets the start timeout, not the pass
    timeout, while the worker says it is alive."""
    client, link = await ready(timeout=0.2)
    waiting = asyncio.create_task(client.submit(job()))
    await link.heard(Submit)
    for n in range(1, 20):
        link.say(Heartbeat(preparing=0.05 * n))  # 0.95 s of preparing, in 19 beats
        await asyncio.sleep(0.05)
    assert client.state is State.READY and not waiting.done()
    link.say(loaded("ckpt", 0))
    (submit,) = [frame for frame in link.sent if isinstance(frame, Submit)]
    link.say(PassDone(0, [submit.id], 1, 1, 0.0, 0.01))
    link.say(Result(submit.id, Decision("ckpt", {}, 1)))
    assert (await waiting).input_tokens == 1
    await client.stop()


async def test_jobs_held_while_nothing_runs_are_a_stall() -> None:
    """The worker is alive (it beats) and holds jobs, but runs nothing: a deadlock."""
    client, link = await ready(timeout=0.2)
    waiting = asyncio.create_task(client.submit(job()))
    await link.heard(Submit)
    for n in range(1, 100):
        if waiting.done():
            break
        link.say(Heartbeat(idle=0.05 * n))
        await asyncio.sleep(0.05)
    with pytest.raises(ProviderUnavailable, match=TIMED_OUT):
        await asyncio.wait_for(waiting, 10)  # a hang guard
