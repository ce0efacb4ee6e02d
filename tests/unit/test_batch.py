"""POST /v1/systemone/batch through the production app in-process (Litestar's test client):
order, lanes, the concurrency cap, all-or-nothing.

The module's app (tests/support/app.py's GATEWAY settings) allows 3 resident providers and 2
simultaneous batch provider calls.
"""

from __future__ import annotations

import itertools
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.app import GATEWAY, InProcessApp, app_fixture, in_process

gateway = app_fixture("gateway", **GATEWAY)


def item(model: str, tag: str, sleep: float = 0.0, fail: str | None = None) -> dict[str, Any]:
    steer: dict[str, Any] = {"tag": tag, "sleep": sleep}
    if fail:
        steer["fail"] = fail
    return {
        "model": model,
        "state": {"fake": steer},
        "questions": {"q": {"type": "choice", "criteria": {"a": "A", "b": "B"}}},
    }


def run(app: InProcessApp, items: list[dict[str, Any]]) -> httpx.Response:
    return app.client.post("/v1/systemone/batch", json={"requests": items})


def events_for(app: InProcessApp, prefix: str) -> list[dict[str, Any]]:
    return [e for e in app.events() if str(e["tag"]).startswith(prefix)]


def test_results_come_back_in_input_order(gateway: InProcessApp) -> None:
    p = uuid.uuid4().hex
    response = run(gateway, [item("von", p + "slow", 0.4), item("jev-latest", p + "fast")])
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["model"] for r in results] == ["von-1.1", "jev-latest"]
    assert all(set(r) == {"model", "answers", "usage"} for r in results)
    slow, fast = sorted(events_for(gateway, p), key=lambda e: e["tag"] != p + "slow")
    assert fast["end"] < slow["end"]  # the other model finished first, yet came second


def test_items_of_one_model_run_in_input_order(gateway: InProcessApp) -> None:
    p = uuid.uuid4().hex
    sleeps = [0.2, 0.0, 0.1, 0.0]
    items = [
        item(["von", "von-1.1", "von-latest", "von"][i], f"{p}{i}", s) for i, s in enumerate(sleeps)
    ]
    assert run(gateway, items).status_code == 200
    events = events_for(gateway, p)
    assert [e["tag"] for e in events] == [f"{p}{i}" for i in range(4)]
    for before, after in itertools.pairwise(events):
        assert after["start"] >= before["end"]  # one at a time


def test_batch_calls_are_capped(gateway: InProcessApp) -> None:
    p = uuid.uuid4().hex
    items = [item(m, f"{p}{m}", 0.3) for m in ("laya", "von", "clm", "jev-latest")]
    assert run(gateway, items).status_code == 200
    events = events_for(gateway, p)
    assert len(events) == 4
    overlap = max(
        sum(e["start"] <= t < e["end"] for e in events) for t in (e["start"] for e in events)
    )
    assert overlap == 2  # different models overlap, but never more than the cap


def test_a_failure_fails_the_whole_batch(gateway: InProcessApp) -> None:
    p = uuid.uuid4().hex
    items = [
        item("von", p + "first"),
        item("von", p + "fails", 0.05, fail="unavailable"),
        item("von-1.1", p + "never"),
        item("laya", p + "other", 0.3),
    ]
    response = run(gateway, items)
    assert response.status_code == 503
    assert response.json()["code"] == "PROVIDER_UNAVAILABLE"
    ran = {e["tag"] for e in events_for(gateway, p)}
    assert p + "first" in ran and p + "fails" in ran
    assert p + "never" not in ran  # later items of the failed model are not forwarded


def test_a_provider_input_error_names_the_item(gateway: InProcessApp) -> None:
    p = uuid.uuid4().hex
    response = run(gateway, [item("laya", p + "a"), item("von", p + "b", fail="input")])
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == [
        "body",
        "requests",
        1,
        "questions",
        "q",
        "criteria",
    ]


def test_the_lowest_failed_index_is_reported(gateway: InProcessApp) -> None:
    p = uuid.uuid4().hex
    items = [item("laya", p + "a", 0.2, fail="input"), item("von", p + "b", fail="unavailable")]
    response = run(gateway, items)
    assert response.status_code == 422  # item 0's error, although item 1 failed first
    assert response.json()["detail"][0]["loc"][:3] == ["body", "requests", 0]


def test_one_batch_answers_like_single_requests(gateway: InProcessApp) -> None:
    items = [item("laya-typed-decisions", "x"), item("clm-latest", "y")]
    batch = run(gateway, items).json()["results"]
    singles = [gateway.client.post("/v1/systemone", json=i).json() for i in items]
    assert batch == singles


def test_the_cap_holds_across_batches(gateway: InProcessApp) -> None:
    p = uuid.uuid4().hex
    batches = [
        [item("laya", f"{p}a1", 0.3), item("jev-latest", f"{p}a2", 0.3)],
        [item("von", f"{p}b1", 0.3), item("clm", f"{p}b2", 0.3)],
    ]
    with ThreadPoolExecutor(2) as pool:
        statuses = [r.status_code for r in pool.map(lambda b: run(gateway, b), batches)]
    assert statuses == [200, 200]
    events = events_for(gateway, p)
    assert len(events) == 4
    overlap = max(
        sum(e["start"] <= t < e["end"] for e in events) for t in (e["start"] for e in events)
    )
    assert overlap <= 2


def loads(app: InProcessApp) -> dict[str, float]:
    """`decidealot_provider_loads_total{result="ok"}` per provider, from /metrics."""
    text = app.client.get("/metrics").text
    return {
        sample.labels["provider"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "decidealot_provider_loads_total" and sample.labels["result"] == "ok"
    }


def test_a_batch_switches_at_most_once_per_model_starting_with_the_resident_one(
    tmp_path: Path,
) -> None:
    """One slot, Laya resident: a batch alternating Von and Laya runs the Laya items first,
    then switches to Von once, and still answers in input order."""
    with in_process(tmp_path, **{**GATEWAY, "DECIDEALOT_MAX_RESIDENT_PROVIDERS": "1"}) as app:
        before = loads(app)  # the registry is the process's: other apps' loads count there too

        def loaded() -> dict[str, float]:
            now = loads(app)
            return {
                name: n - before.get(name, 0) for name, n in now.items() if n > before.get(name, 0)
            }

        assert run(app, [item("laya", "warm")]).status_code == 200
        assert loaded() == {"laya": 1}
        p = uuid.uuid4().hex
        models = ["von", "laya", "von-1.1", "laya-english", "jev-latest"]
        response = run(app, [item(m, f"{p}{i}", 0.05) for i, m in enumerate(models)])
        assert response.status_code == 200
        answered = [r["model"] for r in response.json()["results"]]
        assert answered == ["von-1.1", "laya-english", "von-1.1", "laya-english", "jev-latest"]
        assert loaded() == {"laya": 1, "von": 1}  # no switch back to Laya
        local = [e for e in events_for(app, p) if e["provider"] != "jev"]
        assert [e["provider"] for e in local] == ["laya", "laya", "von", "von"]
        assert run(app, [item("laya", "x"), item("von", "y")]).status_code == 200
        assert loaded() == {"laya": 2, "von": 1}  # Von resident: Von's item, then Laya's
