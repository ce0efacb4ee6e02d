"""The drain in process (the quick loop's share of tests/e2e/test_shutdown.py): the gateway
layer over an app whose requests take as long as a test says. Admitted requests that finish
within DECIDEALOT_DRAIN_SECONDS get their answers, what is left gets a clean 503 when it ends,
and nothing new is admitted meanwhile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from decidealot import registry
from decidealot.asgi.middleware import Gateway
from decidealot.ledger import ADMITTED
from decidealot.mcp.server import ServiceBackend, ToolFailure
from decidealot.mcp.tools import LIST_MODELS
from decidealot.service import Service


def scope(seconds: float) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": f"/slow/{seconds}", "headers": []}


BEGAN: list[str] = []
"""The paths `slow` has begun answering: a request there was admitted."""


async def slow(scope: Any, receive: Any, send: Any) -> None:
    """Answers 200 after the seconds its path names; a started response for `/slow/-1`."""
    BEGAN.append(scope["path"])
    seconds = float(scope["path"].rsplit("/", 1)[1])
    if seconds < 0:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"[", "more_body": True})
        seconds = 10
    await asyncio.sleep(seconds)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def call(gateway: Gateway, seconds: float) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await gateway(scope(seconds), None, send)  # type: ignore[arg-type]
    return sent


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run until `condition` holds; 10 s guard against a hang, failing on `what`."""
    try:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"never {what}") from None


async def test_the_drain_answers_what_finishes_and_cuts_the_rest_with_a_503() -> None:
    service = Service(registry.settings(), providers=[])
    gateway = Gateway(slow, service)
    BEGAN.clear()
    quick, long, streaming = (asyncio.create_task(call(gateway, s)) for s in (0.05, 10, -1))
    await until(lambda: len(BEGAN) == 3, "all three admitted")
    draining = asyncio.create_task(service.ledger.drain(0.3))
    await until(lambda: service.ledger.draining, "the drain began")
    refused = await call(gateway, 0)
    await asyncio.wait_for(draining, 5)

    assert [m.get("status") for m in await quick] == [200, None]
    cut = await long
    assert cut[0]["status"] == 503
    assert (b"retry-after", b"1") in cut[0]["headers"]
    assert json.loads(cut[1]["body"])["message"] == (
        "the service shut down before this request finished"
    )
    started = await streaming  # its response had begun: it is ended, not replaced
    assert [m.get("status") for m in started] == [200, None, None]
    assert started[-1] == {"type": "http.response.body", "body": b""}
    assert refused[0]["status"] == 503
    assert json.loads(refused[1]["body"])["message"] == "the service is shutting down"


async def test_an_mcp_tool_call_the_drain_cuts_is_answered_as_a_tool_error() -> None:
    """Over /mcp the gateway admitted the request, so the drain cancels the tool call in its
    place (`Ledger.cut_instead`); over stdio the call was admitted itself. Either way the call
    fails as the HTTP API answers a cut request, and the transport's request completes."""
    service = Service(registry.settings(), providers=[])
    never = asyncio.Event()

    async def models() -> None:
        await never.wait()

    service.models = models  # type: ignore[method-assign]
    failures: list[ToolFailure] = []

    async def tool_call(admits: bool) -> None:
        try:
            await ServiceBackend(service, admits=admits).call(LIST_MODELS, {})
        except ToolFailure as failure:
            failures.append(failure)

    async def over_mcp() -> None:
        request = asyncio.current_task()
        assert service.ledger.enter(request)
        ADMITTED.set(request)
        try:
            await asyncio.create_task(tool_call(admits=False))
        finally:
            service.ledger.leave(request)

    calls = [asyncio.create_task(over_mcp()), asyncio.create_task(tool_call(admits=True))]
    await asyncio.sleep(0.05)
    await asyncio.wait_for(service.ledger.drain(0.05), 5)
    await asyncio.wait_for(asyncio.gather(*calls), 5)

    assert [failure.status for failure in failures] == [503, 503]
    assert {failure.envelope["message"] for failure in failures} == {
        "the service shut down before this request finished"
    }
