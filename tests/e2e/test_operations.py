"""`GET /metrics` and the log lines, over real HTTP with real worker subprocesses
(tests/ops_server): what traffic, batching, model switching, a worker crash and an unload
show in the metrics, and that logs are JSON lines carrying the right request id and nothing
secret.
"""

from __future__ import annotations

import json
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from decidealot.metrics import CONTENT_TYPE
from tests.support import ops_launcher as ops_server
from tests.support.servers import RunningServer, health_once_signalled, wait_until

API_KEY = "op-key-Vb7Qm2Lx9Tz4"
TYPESAFE_KEY = "ts-key-Hn3Wc8Pr5Ys1"
MARKER = "state-marker-Jq6Zd0"  # request contents: must never reach a log line or a metric
UNKNOWN_PATH = "/v2/path-marker-Rk2Ue5"  # a raw path must never become a metric label
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LOG_FIELDS = {"time", "level", "logger", "request_id", "message"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def decision(model: str, **steer: object) -> dict[str, Any]:
    return {
        "model": model,
        "state": {"text": MARKER, "arith": steer},
        "questions": {"q": {"type": "noul", "instructions": f"is {MARKER} urgent?"}},
    }


def scrape(server: RunningServer) -> tuple[str, Samples]:
    response = httpx.get(server.url + "/metrics", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return response.text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One slot, Laya and Von on arith workers, the fake Jev, keys set."""
    running = ops_server.start(
        tmp_path_factory.mktemp("operations"),
        DECIDEALOT_API_KEY=API_KEY,
        DECIDEALOT_TYPESAFE_API_KEY=TYPESAFE_KEY,
        DECIDEALOT_MAX_RESIDENT_PROVIDERS="1",
    )
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def traffic(server: RunningServer) -> dict[str, str]:
    """Known traffic, once: three Laya requests (two share a pass), Von (evicting Laya), Jev,
    a 422, a 404, a Laya worker crash and the restart after it, then unload-all."""
    ids = {"failed": str(uuid.uuid4())}

    def post(body: dict[str, Any], request_id: str | None = None) -> httpx.Response:
        headers = {**AUTH, "x-request-id": request_id or str(uuid.uuid4())}
        return httpx.post(server.url + "/v1/systemone", json=body, headers=headers, timeout=30)

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, decision("laya", sleep=0.6))
        # the next two queue while the first pass runs, and share one pass
        wait_until(lambda: ops_server.passes(server) != [], "the first pass began")
        rest = [pool.submit(post, decision("laya")) for _ in range(2)]
        assert [f.result().status_code for f in (first, *rest)] == [200, 200, 200]
    assert post(decision("von")).status_code == 200
    jev = {**decision("jev-latest"), "state": {"text": MARKER}}
    assert post(jev).status_code == 200
    assert post({**decision("laya"), "model": "nope"}).status_code == 422
    assert httpx.get(server.url + UNKNOWN_PATH, headers=AUTH).status_code == 404
    assert post(decision("laya", fail="run"), ids["failed"]).status_code == 503
    assert post(decision("laya", crash="run")).status_code == 503
    assert post(decision("laya")).status_code == 200
    assert httpx.post(server.url + "/v1/models/unload", headers=AUTH).status_code == 200
    return ids


def test_requests_are_counted_by_route_method_and_status(
    server: RunningServer, traffic: dict[str, str]
) -> None:
    text, samples = scrape(server)
    requests = "decidealot_http_requests_total"
    route = {"route": "/v1/systemone", "method": "POST"}
    assert value(samples, requests, **route, status="200") == 6
    assert value(samples, requests, **route, status="503") == 2
    assert value(samples, requests, **route, status="422") == 1
    assert value(samples, requests, route="other", method="GET", status="404") == 1
    assert value(samples, requests, route="/v1/models/unload", method="POST", status="200") == 1
    durations = "decidealot_http_request_duration_seconds_count"
    assert value(samples, durations, route=route["route"]) == 9
    assert value(samples, "decidealot_http_requests_in_flight") == 1  # this scrape
    for secret in (MARKER, UNKNOWN_PATH, API_KEY, TYPESAFE_KEY):
        assert secret not in text


def test_decisions_are_counted_by_provider_model_and_outcome(
    server: RunningServer, traffic: dict[str, str]
) -> None:
    _, samples = scrape(server)
    decisions = "decidealot_decisions_total"
    assert value(samples, decisions, provider="laya", model="laya", outcome="ok") == 4
    assert value(samples, decisions, provider="laya", model="laya", outcome="unavailable") == 2
    assert value(samples, decisions, provider="von", model="von", outcome="ok") == 1
    assert value(samples, decisions, provider="jev", model="jev-latest", outcome="ok") == 1
    assert not any(k[0] == decisions and ("model", "nope") in k[1] for k in samples)
    assert value(samples, "decidealot_decision_duration_seconds_count", provider="laya") == 6
    assert value(samples, "decidealot_input_tokens_total", provider="von") > 0


def test_forward_passes_and_batch_sizes(server: RunningServer, traffic: dict[str, str]) -> None:
    _, samples = scrape(server)
    passes = value(samples, "decidealot_forward_pass_seconds_count", provider="laya")
    assert value(samples, "decidealot_batch_size_sum", provider="laya") == 4  # answered jobs
    assert value(samples, "decidealot_batch_size_count", provider="laya") == passes
    assert passes <= 3  # two of the first three shared a pass
    assert value(samples, "decidealot_batch_size_bucket", provider="laya", le="1") < passes
    assert value(samples, "decidealot_forward_pass_seconds_sum", provider="laya") >= 0.6
    assert value(samples, "decidealot_batch_tokens_count", provider="von") == 1


def test_residency_and_worker_lifecycle(server: RunningServer, traffic: dict[str, str]) -> None:
    _, samples = scrape(server)
    unloads = "decidealot_provider_unloads_total"
    assert value(samples, unloads, provider="laya", reason="evicted") == 1
    assert value(samples, unloads, provider="von", reason="evicted") == 1
    assert value(samples, unloads, provider="laya", reason="unload_all") == 1
    assert value(samples, "decidealot_provider_loads_total", provider="laya", result="ok") == 3
    assert value(samples, "decidealot_provider_load_seconds_count", provider="von") == 1
    assert value(samples, "decidealot_provider_loaded", provider="laya") == 0
    assert value(samples, "decidealot_provider_loaded", provider="von") == 0
    # Laya's first start and the start after its crash are new processes; Von took Laya's
    # worker over, and Laya took it back, in place.
    assert value(samples, "decidealot_worker_starts_total", provider="laya") == 2
    assert value(samples, "decidealot_worker_reuses_total", provider="laya") == 1
    assert value(samples, "decidealot_worker_reuses_total", provider="von") == 1
    assert value(samples, "decidealot_worker_starts_total", provider="von") == 0
    assert value(samples, "decidealot_worker_failures_total", provider="laya", reason="exited") == 1
    assert value(samples, "decidealot_worker_restarts_total", provider="laya") == 1
    assert value(samples, "decidealot_worker_restarts_total", provider="von") == 0


def test_log_lines_are_json_with_the_request_id_and_nothing_secret(
    server: RunningServer, traffic: dict[str, str]
) -> None:
    # the access line of the traffic's last request is written after its answer
    wait_until(
        lambda: any("POST /v1/models/unload 200" in line for line in server.log_lines()),
        "the last request's access line",
    )
    lines = [json.loads(line) for line in server.log_lines() if line.strip()]
    assert lines and all(set(line) - {"exception"} == LOG_FIELDS for line in lines)
    text = server.log_file.read_text()
    assert MARKER not in text and API_KEY not in text and TYPESAFE_KEY not in text
    failed = traffic["failed"]
    # the worker's failure is logged under the request whose job failed, not the one that
    # happened to start the worker; the worker's own stderr belongs to no request
    failure = [line for line in lines if line["message"].startswith("worker failed job")]
    assert [line["request_id"] for line in failure] == [failed]
    forwarded = [line for line in lines if "decidealot.worker:" in line["message"]]
    assert forwarded and {line["request_id"] for line in forwarded} == {"-"}
    access = [line for line in lines if line["request_id"] == failed]
    assert any(line["message"].startswith("POST /v1/systemone 503") for line in access)


def test_metrics_need_the_key_when_one_is_set(server: RunningServer) -> None:
    assert httpx.get(server.url + "/metrics").status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.get(server.url + "/metrics", headers=wrong).status_code == 401
    assert httpx.get(server.url + "/metrics", headers=AUTH).status_code == 200


def test_metrics_answer_while_draining(launch: Callable[..., RunningServer]) -> None:
    server = launch()
    state = {"fake": {"sleep": 1.5, "tag": "slow"}}
    slow = {"model": "von", "state": state, "questions": {"q": {"type": "noul"}}}
    answered: dict[str, int] = {}

    def send() -> None:
        response = httpx.post(server.url + "/v1/systemone", json=slow, timeout=10)
        answered["slow"] = response.status_code

    thread = threading.Thread(target=send)
    thread.start()
    wait_until(lambda: "slow" in server.begun(), "the slow decision began")
    server.process.send_signal(signal.SIGTERM)
    with httpx.Client(base_url=server.url) as client:
        assert health_once_signalled(client).status_code == 503
        metrics = client.get("/metrics")
    assert metrics.status_code == 200
    in_flight = [
        s.value
        for family in text_string_to_metric_families(metrics.text)
        for s in family.samples
        if s.name == "decidealot_http_requests_in_flight"
    ]
    assert in_flight == [2]  # the slow decision and this scrape
    thread.join(10)
    assert answered["slow"] == 200
    assert server.process.wait(20) == 0


def test_no_worker_is_left_after_the_module(server: RunningServer) -> None:
    assert ops_server.children(server.process.pid) == set()
    assert Path(server.log_file).exists()
