"""Model switches at one resident slot, over the real `decidealot serve` on tiny checkpoints.

With DECIDEALOT_MAX_RESIDENT_PROVIDERS=1, Laya and Von requests take turns: each switch hands
the one worker process from one provider to the other, its old engine dropped and memory
returned before the new one loads. These tests pin what must not change on that path: one
model (one worker) at a time, memory returned on each switch, no torch in any process before a
request selects a local model and none left after an unload or an idle unload (the service's
memory back within 50 MB of where it was before the first load), and a crashed worker answers
503 and the next request recovers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.ops_launcher import children
from tests.support.servers import RunningServer, start_server

ANSWERING_MODEL = {"laya-english": "laya-english", "von": "von-1.1"}
"""Selector -> the `model` its answer must name."""
WORKER_LINE = re.compile(r"^(starting worker|starting engine in worker|worker stopped) \(pid (\d+)")
MEMORY_SLACK = 50e6
"""The contract's bound on what the service may keep after an unload."""


def worker_events(server: RunningServer) -> list[tuple[str, str, int]]:
    """(provider, "start" | "swap" | "stop", pid) per worker log line, in order."""
    kinds = {"starting worker": "start", "starting engine in worker": "swap"}
    events = []
    for line in server.log_lines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        logger = str(record.get("logger", ""))
        match = WORKER_LINE.match(str(record.get("message", "")))
        if match and logger.startswith("decidealot.runtime."):
            kind = kinds.get(match[1], "stop")
            events.append((logger.rsplit(".", 1)[1], kind, int(match[2])))
    return events


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def holds_torch(pid: int) -> bool:
    """Whether the process has torch's library mapped (it never unloads once imported)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def service_memory(server: RunningServer) -> int:
    """Resident bytes of the gateway and its workers."""
    return rss(server.process.pid) + sum(rss(pid) for pid in children(server.process.pid))


@dataclass
class WorkerWatch:
    """Samples the gateway's live child processes until stopped."""

    pid: int
    seen: set[int] = field(default_factory=set)
    most_at_once: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            alive = children(self.pid)
            self.seen |= alive
            self.most_at_once = max(self.most_at_once, len(alive))
            self.samples += 1
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()


def serve(folder: Path, tiny: TinyCheckpoints, **env: str) -> RunningServer:
    """`decidealot serve` on tiny Laya and Von checkpoints, one resident slot."""
    laya = tiny.laya_all()
    return start_server(
        folder,
        launcher="decidealot",
        args=("serve",),
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        DECIDEALOT_MAX_RESIDENT_PROVIDERS="1",
        DECIDEALOT_VON_CHECKPOINT=str(tiny.von(independent_options=False)),
        **laya_settings(laya),
        **env,
    )


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyCheckpoints
) -> Iterator[RunningServer]:
    server = serve(tmp_path_factory.mktemp("switching"), tiny)
    yield server
    assert server.stop() == 0


def decision(model: str, index: int) -> dict[str, object]:
    return {
        "model": model,
        "state": f"Ticket {index}: the customer was charged twice and asks for a refund.",
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team should handle this ticket?",
                "criteria": {"billing": "Payments and refunds.", "technical": "Outages."},
            }
        },
    }


def decide(server: RunningServer, model: str, index: int = 0) -> httpx.Response:
    return httpx.post(server.url + "/v1/systemone", json=decision(model, index), timeout=120)


def check_answer(selector: str, response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == ANSWERING_MODEL[selector]
    probabilities = body["answers"]["team"]["probabilities"]
    assert set(probabilities) == {"billing", "technical"}
    assert sum(probabilities.values()) == pytest.approx(1.0, abs=1e-3)


def test_alternating_requests_take_turns_in_one_worker_one_model_at_a_time(
    gateway: RunningServer,
) -> None:
    """Laya and Von requests arrive interleaved while the first model is still loading: each
    is answered, in strict turns, by one worker process whose engine is swapped in place."""
    selectors = ["laya-english", "von"] * 2
    watch = WorkerWatch(gateway.process.pid)
    watcher = threading.Thread(target=watch.run, daemon=True)
    watcher.start()

    def send(index: int) -> httpx.Response:
        time.sleep(0.3 * index)  # arrive in order, all while the first model is loading
        return decide(gateway, selectors[index], index)

    try:
        with ThreadPoolExecutor(len(selectors)) as pool:
            responses = list(pool.map(send, range(len(selectors))))
    finally:
        watch.stop()
        watcher.join()

    for selector, response in zip(selectors, responses, strict=True):
        check_answer(selector, response)
    events = worker_events(gateway)
    loads = [(name, kind) for name, kind, _ in events if kind != "stop"]
    assert loads == [("laya", "start"), ("von", "swap"), ("laya", "swap"), ("von", "swap")]
    pids = {pid for _, _, pid in events}
    assert len(pids) == 1  # one process served every turn
    assert watch.samples > 100
    assert watch.most_at_once == 1  # by /proc: never two workers at once
    assert watch.seen == pids

    unload = httpx.post(gateway.url + "/v1/models/unload", timeout=30)
    assert unload.status_code == 200, unload.text
    was_loaded = {p["name"]: p["wasLoaded"] for p in unload.json()["providers"]}
    assert was_loaded == {"laya": False, "von": True}
    assert children(gateway.process.pid) == set()


def test_torch_only_while_a_local_model_is_loaded_and_memory_returns_on_each_switch(
    tmp_path: Path, tiny: TinyCheckpoints
) -> None:
    server = serve(tmp_path / "memory", tiny, DECIDEALOT_PROVIDER_IDLE_UNLOAD_SECONDS="3")
    try:
        gateway = server.process.pid
        assert httpx.get(server.url + "/v1/models").status_code == 200
        assert children(gateway) == set() and not holds_torch(gateway)
        before = service_memory(server)

        check_answer("laya-english", decide(server, "laya-english"))
        (worker,) = children(gateway)
        assert holds_torch(worker) and not holds_torch(gateway)
        with_laya = rss(worker)
        for selector in ("von", "laya-english", "von", "laya-english"):
            check_answer(selector, decide(server, selector))
            assert children(gateway) == {worker}
        assert rss(worker) < with_laya + MEMORY_SLACK  # each switch gave the old model back

        assert httpx.post(server.url + "/v1/models/unload", timeout=30).status_code == 200
        assert children(gateway) == set() and not holds_torch(gateway)
        assert service_memory(server) < before + MEMORY_SLACK

        check_answer("von", decide(server, "von"))  # a cold start after the unload
        check_answer("laya-english", decide(server, "laya-english"))
        deadline = time.monotonic() + 30
        while children(gateway) and time.monotonic() < deadline:  # the idle unload
            time.sleep(0.2)
        assert children(gateway) == set() and not holds_torch(gateway)
        assert service_memory(server) < before + MEMORY_SLACK
    finally:
        assert server.stop() == 0


def test_a_worker_that_dies_after_a_switch_gives_503_and_the_next_request_recovers(
    gateway: RunningServer,
) -> None:
    check_answer("laya-english", decide(gateway, "laya-english"))
    check_answer("von", decide(gateway, "von"))  # Von now runs in the process Laya started
    (worker,) = children(gateway.process.pid)
    os.kill(worker, signal.SIGSTOP)  # it holds the next request without answering
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(decide, gateway, "von", 1)
        time.sleep(0.5)
        os.kill(worker, signal.SIGKILL)
        failed = pending.result()
    assert failed.status_code == 503
    assert failed.json()["code"] == "PROVIDER_UNAVAILABLE"
    check_answer("von", decide(gateway, "von", 2))
    check_answer("laya-english", decide(gateway, "laya-english", 3))
    assert children(gateway.process.pid) - {worker}


def reported_checkpoints(server: RunningServer) -> set[tuple[str, str]]:
    """(provider, checkpoint) of each `decidealot_int8_linear_share` series in /metrics."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {
        (sample.labels["provider"], sample.labels["checkpoint"])
        for family in text_string_to_metric_families(text)
        if family.name == "decidealot_int8_linear_share"
        for sample in family.samples
    }


def wait_reported(server: RunningServer, expected: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The reported checkpoints once they are `expected` (or after 30 s, as they are then)."""
    deadline = time.monotonic() + 30
    while (reported := reported_checkpoints(server)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return reported


def test_a_checkpoints_gauges_go_when_it_unloads_whatever_unloads_it(
    tmp_path: Path, tiny: TinyCheckpoints
) -> None:
    """`decidealot_int8_linear_share` has a series for a checkpoint only while it is loaded: a
    switch (eviction), unload-all, the worker's death and the idle unload each remove it. The
    first three take it away before the request or the kill they follow is done with;
    the idle unload and a death are waited for."""
    server = serve(tmp_path / "gauges", tiny, DECIDEALOT_PROVIDER_IDLE_UNLOAD_SECONDS="3")
    laya, von = ("laya", "english"), ("von", "von-1.1")
    try:
        check_answer("laya-english", decide(server, "laya-english"))
        assert reported_checkpoints(server) == {laya}
        check_answer("von", decide(server, "von"))  # evicts laya: its worker swaps engines
        assert reported_checkpoints(server) == {von}
        assert server.metric("decidealot_provider_unloads_total", reason="evicted") == 1

        assert httpx.post(server.url + "/v1/models/unload", timeout=30).status_code == 200
        assert reported_checkpoints(server) == set()

        check_answer("von", decide(server, "von"))
        (worker,) = children(server.process.pid)
        os.kill(worker, signal.SIGKILL)
        assert wait_reported(server, set()) == set()
        assert server.metric("decidealot_worker_failures_total", reason="exited") == 1

        check_answer("von", decide(server, "von"))
        assert reported_checkpoints(server) == {von}
        assert wait_reported(server, set()) == set()  # the idle unload, 3 s after
        assert server.metric("decidealot_provider_unloads_total", reason="idle") == 1
    finally:
        assert server.stop() == 0
