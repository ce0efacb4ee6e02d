"""With one resident slot, alternating Laya and Von requests all answer, switching models.

The real `decidealot serve` (granian, residency, worker subprocesses running the real engines on
tiny random checkpoints) runs with DECIDEALOT_MAX_RESIDENT_PROVIDERS=1. Laya and Von requests
arrive interleaved while the first model is still loading, so residency must unload one
provider's worker and start the other's for each of them in turn. A thread watches the
gateway's child processes in /proc the whole time: two workers must never be alive at once.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.checkpoints import TinyCheckpoints
from tests.support.ops_launcher import children

ROOT = Path(__file__).resolve().parents[2]
ANSWERING_MODEL = {"laya-english": "laya-english", "von": "von-1.1"}
"""Selector -> the `model` its answer must name."""
WORKER_LINE = re.compile(r"^(starting worker|worker stopped) \(pid (\d+)")


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[bytes]
    log_file: Path

    def worker_events(self) -> list[tuple[str, str, int]]:
        """(provider, "start" | "stop", pid) per worker log line, in order."""
        events = []
        for line in self.log_file.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            logger = str(record.get("logger", ""))
            match = WORKER_LINE.match(str(record.get("message", "")))
            if match and logger.startswith("decidealot.worker."):
                kind = "start" if match[1] == "starting worker" else "stop"
                events.append((logger.rsplit(".", 1)[1], kind, int(match[2])))
        return events


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, tiny: TinyCheckpoints) -> Iterator[Gateway]:
    """`python -m decidealot serve` on tiny Laya and Von checkpoints, one resident slot."""
    folder = tmp_path_factory.mktemp("switching")
    von = tiny.von(independent_options=False)
    laya = tiny.laya_all()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")} | {
        "DECIDEALOT_HOST": "127.0.0.1",
        "DECIDEALOT_PORT": str(port),
        "DECIDEALOT_DEVICE": "cpu",
        "DECIDEALOT_TORCH_THREADS": "1",
        "DECIDEALOT_MAX_RESIDENT_PROVIDERS": "1",
        "DECIDEALOT_MODEL_DIR": str(folder / "models"),
        "DECIDEALOT_LOG_FORMAT": "json",
        "DECIDEALOT_VON_CHECKPOINT": str(von),
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT": str(laya["english"]),
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT": str(laya["multilingual"]),
        "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT": str(laya["typed-decisions"]),
    }
    log_file = folder / "server.log"
    with log_file.open("wb") as log_out:
        process = subprocess.Popen(
            [sys.executable, "-m", "decidealot", "serve"],
            cwd=ROOT,
            env=env,
            stdout=log_out,
            stderr=subprocess.STDOUT,
        )
    server = Gateway(f"http://127.0.0.1:{port}", process, log_file)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"decidealot serve exited: {log_file.read_text()[-2000:]}")
            try:
                if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("decidealot serve did not answer /health in 30 s")
            time.sleep(0.05)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


def test_alternating_laya_and_von_requests_switch_the_one_resident_model(
    gateway: Gateway,
) -> None:
    selectors = ["laya-english", "von"] * 2
    watch = WorkerWatch(gateway.process.pid)
    watcher = threading.Thread(target=watch.run, daemon=True)
    watcher.start()

    def send(index: int) -> httpx.Response:
        time.sleep(0.3 * index)  # arrive in order, all while the first model is loading
        return httpx.post(
            gateway.url + "/v1/systemone", json=decision(selectors[index], index), timeout=120
        )

    try:
        with ThreadPoolExecutor(len(selectors)) as pool:
            responses = list(pool.map(send, range(len(selectors))))
    finally:
        watch.stop()
        watcher.join()

    for selector, response in zip(selectors, responses, strict=True):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == ANSWERING_MODEL[selector]
        probabilities = body["answers"]["team"]["probabilities"]
        assert set(probabilities) == {"billing", "technical"}
        assert sum(probabilities.values()) == pytest.approx(1.0, abs=1e-3)

    events = gateway.worker_events()
    starts = [(name, pid) for name, kind, pid in events if kind == "start"]
    loaded = [name for name, _ in starts]
    assert loaded == ["laya", "von"] * 2, events  # one load per request: strict turns
    assert len({pid for _, pid in starts}) == len(starts)  # each load is a fresh process
    live: set[int] = set()
    for _, kind, pid in events:  # by the log: a worker starts only once the last one stopped
        if kind == "start":
            assert not live, events
            live.add(pid)
        else:
            live.discard(pid)
    assert watch.samples > 100
    assert watch.most_at_once == 1  # by /proc: never two workers at once
    assert watch.seen == {pid for _, pid in starts}

    unload = httpx.post(gateway.url + "/v1/models/unload", timeout=30)
    assert unload.status_code == 200, unload.text
    was_loaded = {p["name"]: p["wasLoaded"] for p in unload.json()["providers"]}
    assert was_loaded == {"laya": False, "von": True}
    assert children(gateway.process.pid) == set()
