"""A stalled worker is lost within the pass timeout, in a pass or between passes.

An operator's bad day: a worker frozen (SIGSTOP) and never thawed, at one resident slot with
Laya and Von taking turns, so that it is frozen between passes, in a pass or in a model switch.
Every request in flight is answered (503 `PROVIDER_UNAVAILABLE` where the frozen worker held
it) within `DECIDEALOT_PROVIDER_TIMEOUT_SECONDS` of nothing moving, not after the start timeout
(600 s), the frozen process is killed, and the next request starts a new worker. The clients'
timeouts here are hang guards, far below the start timeout a stall used to get.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_switching import check_answer, decide, decision, serve, worker_events
from tests.support.checkpoints import TinyCheckpoints
from tests.support.ops_launcher import children, running
from tests.support.ops_launcher import start as start_ops
from tests.support.servers import RunningServer, wait_until

PASS_TIMEOUT = "2"
HANG_GUARD = 60.0
"""Seconds a client waits: far over the pass timeout, far under the 600 s start timeout."""


def worker(server: RunningServer) -> int:
    """The gateway's one worker process."""
    wait_until(lambda: len(children(server.process.pid)) == 1, "one worker under the gateway")
    (pid,) = children(server.process.pid)
    return pid


def unavailable(response: httpx.Response) -> bool:
    return response.status_code == 503 and response.json()["code"] == "PROVIDER_UNAVAILABLE"


def stalls(server: RunningServer) -> float:
    return server.metric("decidealot_worker_failures_total", reason="timeout")


@pytest.fixture(scope="module")
def real(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyCheckpoints
) -> Iterator[RunningServer]:
    """`decidealot serve` on tiny Laya and Von checkpoints, one resident slot."""
    server = serve(
        tmp_path_factory.mktemp("frozen"), tiny, DECIDEALOT_PROVIDER_TIMEOUT_SECONDS=PASS_TIMEOUT
    )
    yield server
    assert server.stop() == 0


def test_a_worker_frozen_between_passes_is_lost_and_replaced(real: RunningServer) -> None:
    check_answer("laya-english", decide(real, "laya-english"))
    frozen = worker(real)
    os.kill(frozen, signal.SIGSTOP)  # idle: the next request's job waits and nothing moves
    before = stalls(real)
    failed = httpx.post(
        real.url + "/v1/systemone", json=decision("laya-english", 0), timeout=HANG_GUARD
    )
    assert unavailable(failed), failed.text
    wait_until(lambda: not running(frozen), "the frozen worker killed")
    assert stalls(real) == before + 1
    check_answer("laya-english", decide(real, "laya-english"))
    assert worker(real) != frozen


def test_mixed_traffic_survives_a_worker_frozen_wherever_it_is(real: RunningServer) -> None:
    """Two clients, one Laya and one Von, keep deciding at one slot; three times the worker is
    frozen wherever it happens to be (mostly switching models, else between passes or in a
    pass). Each time it is killed and replaced, every request is answered (503 where the frozen
    worker held it; none where it was frozen releasing the old model, which a switch ends
    after `EXIT_GRACE_SECONDS` by starting a new worker), and the traffic goes on."""
    answered = {"ok": 0, "unavailable": 0}
    stop = threading.Event()
    lock = threading.Lock()

    def client(selector: str) -> None:
        index = 0
        while not stop.is_set():
            index += 1
            response = httpx.post(
                real.url + "/v1/systemone", json=decision(selector, index), timeout=HANG_GUARD
            )
            with lock:
                if response.status_code == 200:
                    check_answer(selector, response)
                    answered["ok"] += 1
                else:
                    assert unavailable(response), response.text
                    answered["unavailable"] += 1

    with ThreadPoolExecutor(2) as pool:
        clients = [pool.submit(client, s) for s in ("laya-english", "von")]
        for freeze in range(3):
            wait_until(lambda n=freeze: answered["ok"] >= 6 * (n + 1), "traffic flowing")
            frozen = worker(real)
            os.kill(frozen, signal.SIGSTOP)
            wait_until(lambda pid=frozen: not running(pid), "the frozen worker killed", 30)
        wait_until(lambda: answered["ok"] >= 24, "traffic flowing after the last freeze")
        stop.set()
        for each in clients:
            each.result()  # re-raises a client's failed assertion or hang guard


def test_a_worker_frozen_while_it_builds_the_next_model_is_lost(tmp_path: Path) -> None:
    """A switch's engine build (here 3 s long) is where a one-slot worker spends its time
    between passes: frozen there, the request waiting for the model is answered 503 once
    nothing has moved for the pass timeout, not after the start timeout, and the next one
    starts a new worker."""
    server = start_ops(
        tmp_path,
        DECIDEALOT_MAX_RESIDENT_PROVIDERS="1",
        DECIDEALOT_PROVIDER_TIMEOUT_SECONDS=PASS_TIMEOUT,
        DECIDEALOT_TEST_ARITH_OPTIONS=json.dumps({"start_delay": 3}),
    )
    try:
        assert _arith(server, "laya").status_code == 200
        switching = ThreadPoolExecutor(1)
        waiting = switching.submit(_arith, server, "von")
        wait_until(
            lambda: any(e[:2] == ("von", "swap") for e in worker_events(server)),
            "the switch to Von begun",
        )
        frozen = worker(server)
        os.kill(frozen, signal.SIGSTOP)
        failed = waiting.result()
        assert unavailable(failed), failed.text
        wait_until(lambda: not running(frozen), "the frozen worker killed")
        assert _arith(server, "von").status_code == 200
        assert worker(server) != frozen
        switching.shutdown()
    finally:
        assert server.stop() == 0


def _arith(server: RunningServer, provider: str) -> httpx.Response:
    body = {"model": provider, "state": "s", "questions": {"q": {"type": "noul"}}}
    return httpx.post(server.url + "/v1/systemone", json=body, timeout=HANG_GUARD)
