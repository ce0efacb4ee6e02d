"""A bounded soak: mixed concurrent load on one slot, with unloads and idle unloads, over real
HTTP and real worker subprocesses (tests/ops_server). Every response must be one the contract
allows for it, every answer must be the one its own request gets alone, and no worker may leak.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from decidealot.contract import NoulQuestion
from decidealot.jobs import Job
from tests.support import ops_launcher as ops_server
from tests.support.engines.arith import answer
from tests.support.servers import RunningServer

LOAD_SECONDS = 12.0
IDLE_UNLOAD_SECONDS = 0.4
CYCLE_SECONDS, QUIET_SECONDS = 3.0, 1.0
"""Each cycle ends quiet for longer than the idle unload, so idle unloads and unload-all run
on idle providers too, not only between back-to-back requests."""
LOCAL_MODELS = ("laya", "laya-english", "von", "von-1.1")


class Soak:
    """The load's shared record: outcome counts and every unexpected response."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self._lock = threading.Lock()

    def count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def fail(self, what: str) -> None:
        with self._lock:
            self.unexpected.append(what)

    def pause(self, rng: random.Random) -> None:
        """Nearly back to back, except through the quiet end of each cycle."""
        into_cycle = (time.monotonic() - self.started) % CYCLE_SECONDS
        quiet_from = CYCLE_SECONDS - QUIET_SECONDS
        until_loud = CYCLE_SECONDS - into_cycle if into_cycle >= quiet_from else 0.0
        self.stop.wait(until_loud + rng.random() * 0.02)


def request(model: str, rng: random.Random) -> dict[str, object]:
    state: dict[str, object] = {"ticket": rng.randrange(10**6), "words": "x" * rng.randrange(40)}
    if model.startswith(("laya", "von")):
        state["arith"] = {"sleep": rng.choice((0, 0, 0.01, 0.03))}
    names = [f"q{i}" for i in range(rng.randint(1, 3))]
    return {
        "model": model,
        "state": state,
        "questions": {name: {"type": "noul", "instructions": "?"} for name in names},
    }


def expected(body: dict[str, object]) -> dict[str, object] | None:
    """The answer the arith engine gives this request alone; None for the fake Jev."""
    model = str(body["model"])
    if not model.startswith(("laya", "von")):
        return None
    questions = {name: NoulQuestion() for name in body["questions"]}  # type: ignore[attr-defined]
    decision = answer(Job(model, body["state"], questions))  # type: ignore[arg-type]
    return {
        "model": model,
        "answers": {name: {"type": "noul", "noul": a.noul} for name, a in decision.answers.items()},
        "usage": {"input_tokens": decision.input_tokens, "output_tokens": 0},
    }


def check_answer(soak: Soak, body: dict[str, object], got: object, where: str) -> None:
    want = expected(body)
    if want is None:
        ok = isinstance(got, dict) and got.get("answers", {}).keys() == body["questions"].keys()  # type: ignore[attr-defined]
    else:
        ok = got == want
    if not ok:
        soak.fail(f"{where}: wrong answer {got!r} for {body!r}")


def decisions(soak: Soak, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=soak.server.url, timeout=30) as http:
        while not soak.stop.is_set():
            body = request(rng.choice((*LOCAL_MODELS, "jev-latest")), rng)
            response = http.post("/v1/systemone", json=body)
            if response.status_code != 200:
                soak.fail(f"decision {body['model']}: {response.status_code} {response.text}")
            else:
                check_answer(soak, body, response.json(), "decision")
                soak.count("decision")
            soak.pause(rng)


def batches(soak: Soak, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=soak.server.url, timeout=30) as http:
        while not soak.stop.is_set():
            items = [
                request(rng.choice((*LOCAL_MODELS, "jev-latest")), rng)
                for _ in range(rng.randint(1, 5))
            ]
            response = http.post("/v1/systemone/batch", json={"requests": items})
            if response.status_code != 200:
                soak.fail(f"batch: {response.status_code} {response.text}")
            else:
                results = response.json()["results"]
                if len(results) != len(items):
                    soak.fail(f"batch: {len(results)} results for {len(items)} items")
                for item, result in zip(items, results, strict=False):
                    check_answer(soak, item, result, "batch")
                soak.count("batch")
            soak.pause(rng)


def unloads(soak: Soak, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=soak.server.url, timeout=30) as http:
        while not soak.stop.wait(rng.uniform(0.2, 0.8)):
            response = http.post("/v1/models/unload")
            if response.status_code == 200:
                names = [p["name"] for p in response.json()["providers"]]
                if names != ["laya", "von"]:
                    soak.fail(f"unload listed {names}")
                soak.count("unloaded")
            elif response.status_code == 409 and response.json()["code"] == "PROVIDER_BUSY":
                soak.count("unload busy")
            else:
                soak.fail(f"unload: {response.status_code} {response.text}")


def watcher(soak: Soak, seed: int) -> None:
    """Health, listings and metrics answer throughout; one slot never holds two workers."""
    with httpx.Client(base_url=soak.server.url, timeout=30) as http:
        while not soak.stop.wait(0.1):
            for path in ("/health", "/v1/models", "/metrics"):
                response = http.get(path)
                if response.status_code != 200:
                    soak.fail(f"{path}: {response.status_code} {response.text}")
            workers = ops_server.children(soak.server.process.pid)
            if len(workers) > 1:
                soak.fail(f"{len(workers)} workers alive with one slot")
            soak.count("watch")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    running = ops_server.start(
        tmp_path,
        DECIDEALOT_MAX_RESIDENT_PROVIDERS="1",
        DECIDEALOT_PROVIDER_IDLE_UNLOAD_SECONDS=str(IDLE_UNLOAD_SECONDS),
        DECIDEALOT_TYPESAFE_API_KEY="upstream-key",
        DECIDEALOT_MAX_BATCH_CONCURRENCY="2",
    )
    yield running
    if running.process.poll() is None:
        running.process.kill()
        running.process.wait()


def test_mixed_load_with_unloads_and_idle_unloads_has_no_unexpected_errors(
    server: RunningServer,
) -> None:
    soak = Soak(server)
    roles: list[tuple[Callable[[Soak, int], None], int]] = [
        (decisions, 1),
        (decisions, 2),
        (decisions, 3),
        (batches, 4),
        (unloads, 5),
        (watcher, 6),
    ]
    threads = [threading.Thread(target=role, args=(soak, seed)) for role, seed in roles]
    failed: list[BaseException] = []
    threading.excepthook = lambda args: failed.append(args.exc_value)  # type: ignore[assignment]
    try:
        for thread in threads:
            thread.start()
        soak.stop.wait(LOAD_SECONDS)
    finally:
        soak.stop.set()
        for thread in threads:
            thread.join(30)
        threading.excepthook = threading.__excepthook__
    assert not failed, failed  # e.g. a transport error: a dropped or hung connection
    assert not any(thread.is_alive() for thread in threads)
    assert soak.unexpected == []
    assert soak.counts["decision"] > 50 and soak.counts["batch"] > 10, soak.counts
    assert soak.counts["unloaded"] > 0 and soak.counts["watch"] > 20, soak.counts

    # quiet now: the last worker unloads by itself, and nothing is left behind
    deadline = time.monotonic() + IDLE_UNLOAD_SECONDS * 10
    while ops_server.children(server.process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ops_server.children(server.process.pid) == set()
    log = server.log_file.read_text()
    assert "Traceback" not in log and "unexpected" not in log

    # the metrics saw the same run: no 5xx anywhere, both kinds of automatic unload happened
    samples = [
        s
        for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
        for s in family.samples
    ]
    statuses = {s.labels["status"] for s in samples if s.name == "decidealot_http_requests_total"}
    assert statuses <= {"200", "409"}, statuses
    reasons = {
        s.labels["reason"]
        for s in samples
        if s.name == "decidealot_provider_unloads_total" and s.value > 0
    }
    assert {"evicted", "idle", "unload_all"} <= reasons, reasons
    answered = sum(
        s.value
        for s in samples
        if s.name == "decidealot_decisions_total" and s.labels["outcome"] == "ok"
    )
    assert answered >= soak.counts["decision"] + soak.counts["batch"]
    assert server.stop() == 0
