"""Admission through the production app in-process (Litestar's test client, requests sent from
threads): `DECIDEALOT_MAX_PENDING_REQUESTS` bounds what local providers hold.

A request marked `held` is held right after admission (in its fake provider's `prepare`, before
residency) until the test releases it, so the admitted requests are provably still running when
the next arrive, with no sleep to guess when they got there; unmarked requests run at once, so a
broken bound shows as a wrong answer, not a hang.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from decidealot.contract import SystemOneRequest
from tests.support.app import InProcessApp, in_process
from tests.support.mcp_clients import MCP_HEADERS, sse_json, tool_outcome
from tests.support.servers import ALL_FAKES


def request(model: str, tag: str = "", held: bool = False) -> dict[str, object]:
    return {
        "model": model,
        "state": {"fake": {"tag": tag, "held": held}},
        "questions": {"q": {"type": "noul", "instructions": "Is it?"}},
    }


def post(app: InProcessApp, path: str, body: object) -> httpx.Response:
    return app.client.post(path, json=body)


def scraped(app: InProcessApp) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(app.client.get("/metrics").text)
        for sample in family.samples
    }


class Hold:
    """Holds `app`'s local requests marked `held` once admitted, until `release` (or the end
    of its `with` block, so that a failed assertion cannot leave them hanging);
    `wait_admitted(n)` returns once `n` of them are held (a batch is held at its first item)."""

    def __init__(self, app: InProcessApp, monkeypatch: pytest.MonkeyPatch) -> None:
        self._arrived = threading.Semaphore(0)
        self._released = asyncio.Event()
        self._portal = app.client.blocking_portal
        for provider in app.service.providers:
            if provider.local:
                monkeypatch.setattr(provider, "accept", self._held(provider.accept))

    def _held(self, prepare: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def held(selector: str, request: SystemOneRequest) -> Any:
            if request.state["fake"]["held"]:
                self._arrived.release()
                await self._released.wait()
            return await prepare(selector, request)

        return held

    def wait_admitted(self, count: int) -> None:
        for _ in range(count):
            assert self._arrived.acquire(timeout=30), "a request was never admitted"

    def release(self) -> None:
        self._portal.call(self._released.set)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_requests_over_the_pending_bound_get_503_with_retry_after_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        in_process(tmp_path, **ALL_FAKES, DECIDEALOT_MAX_PENDING_REQUESTS="3") as app,
        ThreadPoolExecutor(4) as pool,
        Hold(app, monkeypatch) as hold,
    ):
        rejected_before = scraped(app).get("decidealot_admission_rejected_total", 0)
        admitted = [
            pool.submit(post, app, "/v1/systemone", request("laya", f"slow {n}", held=True))
            for n in range(2)
        ]
        batch = pool.submit(
            post,
            app,
            "/v1/systemone/batch",
            {"requests": [request("von", f"item {n}", held=True) for n in range(4)]},
        )  # four items, admitted as one request: they wait their turn inside it
        hold.wait_admitted(3)

        def refusals() -> tuple[httpx.Response, httpx.Response]:
            single = post(app, "/v1/systemone", request("clm"))
            return single, post(app, "/v1/systemone/batch", {"requests": [request("laya")]})

        # answered at once: while the three admitted are held, which they are until released
        # below (the timeout only guards against a hang)
        refused, refused_batch = pool.submit(refusals).result(timeout=30)
        hosted = post(app, "/v1/systemone", request("jev-latest"))  # hosted: not counted
        assert not any(each.done() for each in [*admitted, batch])  # all three still held
        hold.release()
        results = [each.result(timeout=30) for each in [*admitted, batch]]
        for response in (refused, refused_batch):
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            assert response.json()["code"] == "PROVIDER_UNAVAILABLE"
        assert hosted.status_code == 200
        assert [r.status_code for r in results] == [200, 200, 200]
        assert len(results[2].json()["results"]) == 4
        assert post(app, "/v1/systemone", request("laya")).status_code == 200  # room again
        samples = scraped(app)
    # the counter is the process's, shared with every app of the session: count this one's
    assert samples["decidealot_admission_rejected_total"] - rejected_before == 2
    assert samples["decidealot_pending_requests"] == 0


def test_zero_turns_the_pending_bound_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with (
        in_process(tmp_path, **ALL_FAKES, DECIDEALOT_MAX_PENDING_REQUESTS="0") as app,
        ThreadPoolExecutor(8) as pool,
        Hold(app, monkeypatch) as hold,
    ):
        sent = [
            pool.submit(post, app, "/v1/systemone", request("laya", f"r{n}", held=True))
            for n in range(8)
        ]
        hold.wait_admitted(8)  # all eight admitted at once
        hold.release()
        responses = [each.result(timeout=30) for each in sent]
    assert [r.status_code for r in responses] == [200] * 8


def mcp_decision(app: InProcessApp, body: dict[str, object], request_id: int) -> httpx.Response:
    """`system_one` over `POST /mcp`."""
    call = {"name": "system_one", "arguments": body}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call}
    return app.client.post("/mcp", json=message, headers=MCP_HEADERS)


def test_an_mcp_decision_is_admitted_once_beside_http_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At a pending bound of 2, one decision over HTTP and one over /mcp fill it: the next of
    either kind is refused, and the drain counts the two as two requests (the gateway admits
    /mcp requests; the tool does not admit them again). When the drain runs out, each is
    answered that it was cut short: the MCP one as a tool error in its event stream, not a
    stream that ends without a message."""
    with (
        in_process(
            tmp_path,
            **ALL_FAKES,
            DECIDEALOT_MAX_PENDING_REQUESTS="2",
            DECIDEALOT_MCP_ALLOWED_HOSTS="testserver.local",
        ) as app,
        ThreadPoolExecutor(2) as pool,
        Hold(app, monkeypatch) as hold,
    ):
        over_http = pool.submit(post, app, "/v1/systemone", request("laya", "http", held=True))
        over_mcp = pool.submit(mcp_decision, app, request("von", "mcp", held=True), 1)
        hold.wait_admitted(2)
        assert app.service.ledger.requests == 2
        assert scraped(app)["decidealot_pending_requests"] == 2
        refused = post(app, "/v1/systemone", request("clm"))
        is_error, refused_mcp = tool_outcome(
            sse_json(mcp_decision(app, request("clm"), 2))["result"]
        )
        assert refused.status_code == 503
        assert refused.json()["code"] == "PROVIDER_UNAVAILABLE"
        assert is_error and refused_mcp == refused.json()
        assert app.service.ledger.requests == 2
        with caplog.at_level(logging.WARNING, logger="decidealot.service"):
            app.client.blocking_portal.call(app.service.ledger.drain, 0.0)
        answered = over_http.result(timeout=30)
        assert answered.status_code == 503
        assert answered.json()["message"] == "the service shut down before this request finished"
        cut = over_mcp.result(timeout=30)
        assert cut.status_code == 200
        assert tool_outcome(sse_json(cut)["result"]) == (True, answered.json())
        assert app.service.ledger.requests == 0
    assert "2 requests still running after 0 s of draining" in caplog.text
