"""Admission over real HTTP: `DECIDEALOT_MAX_PENDING_REQUESTS` bounds what local providers hold.

The production server over the test providers (`tests/server.py`): requests steer the fakes to
sleep, so the admitted ones are still running when the next arrives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import ALL_FAKES, RunningServer


def request(model: str, sleep: float = 0.0, tag: str = "") -> dict[str, object]:
    return {
        "model": model,
        "state": {"fake": {"sleep": sleep, "tag": tag}},
        "questions": {"q": {"type": "noul", "instructions": "Is it?"}},
    }


def post(server: RunningServer, path: str, body: object) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30)


def test_requests_over_the_pending_bound_get_503_with_retry_after_at_once(
    launch: Callable[..., RunningServer],
) -> None:
    server = launch(**ALL_FAKES, DECIDEALOT_MAX_PENDING_REQUESTS="3")
    with ThreadPoolExecutor(4) as pool:
        admitted = [
            pool.submit(post, server, "/v1/systemone", request("laya", 2.0, f"slow {n}"))
            for n in range(2)
        ]
        batch = pool.submit(
            post,
            server,
            "/v1/systemone/batch",
            {"requests": [request("von", 1.0, f"item {n}") for n in range(4)]},
        )  # four items, admitted as one request: they wait their turn inside it
        time.sleep(0.5)
        started = time.monotonic()
        refused = post(server, "/v1/systemone", request("clm"))
        refused_batch = post(server, "/v1/systemone/batch", {"requests": [request("laya")]})
        waited = time.monotonic() - started
        hosted = post(server, "/v1/systemone", request("jev-latest"))  # hosted: not counted
        results = [each.result() for each in [*admitted, batch]]
    assert waited < 2  # answered at once, not after the slow ones
    for response in (refused, refused_batch):
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json()["code"] == "PROVIDER_UNAVAILABLE"
    assert hosted.status_code == 200
    assert [r.status_code for r in results] == [200, 200, 200]
    assert len(results[2].json()["results"]) == 4
    assert post(server, "/v1/systemone", request("laya")).status_code == 200  # room again
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
        for sample in family.samples
    }
    assert samples["decidealot_admission_rejected_total"] == 2
    assert samples["decidealot_pending_requests"] == 0


def test_zero_turns_the_pending_bound_off(launch: Callable[..., RunningServer]) -> None:
    server = launch(**ALL_FAKES, DECIDEALOT_MAX_PENDING_REQUESTS="0")
    with ThreadPoolExecutor(8) as pool:
        responses = list(
            pool.map(
                lambda n: post(server, "/v1/systemone", request("laya", 0.5, f"r{n}")), range(8)
            )
        )
    assert [r.status_code for r in responses] == [200] * 8
