"""A caller that goes away stops costing anything: HTTP disconnects and MCP cancellations.

The production server over the fake providers (`tests/support/launcher.py`) with one resident
slot: a request steered to sleep holds the slot; those queued behind it wait for it. A cancelled
one must leave that queue (and the decision counter must say so) without anyone answering it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.servers import ALL_FAKES, RunningServer, wait_until


def steered(model: str, sleep: float, tag: str) -> dict[str, Any]:
    return {
        "model": model,
        "state": {"fake": {"sleep": sleep, "tag": tag}},
        "questions": {"q": {"type": "noul", "instructions": "Is it?"}},
    }


def cancelled(server: RunningServer) -> float:
    return server.metric("decidealot_requests_cancelled_total", provider="laya")


def pending(server: RunningServer) -> float:
    """Decision requests admitted to local providers and not yet answered."""
    return server.metric("decidealot_pending_requests")


def holding_the_slot(server: RunningServer, tag: str) -> None:
    """Wait until the fake has begun answering `tag`: its request holds the one slot."""
    wait_until(lambda: tag in server.begun(), f"{tag!r} began")


def hang_up_when_queued(server: RunningServer, body: object) -> None:
    """Send a request on a raw socket and close it once the server has admitted it beside the
    one holding the slot (two pending), before any answer."""
    host, port = server.url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        wait_until(lambda: pending(server) == 2, "the request queued behind the holder")


def test_a_disconnected_client_leaves_its_queue_and_is_never_answered(
    launch: Callable[..., RunningServer],
) -> None:
    server = launch(**ALL_FAKES, DECIDEALOT_MAX_RESIDENT_PROVIDERS="1")
    with httpx.Client(timeout=30) as client:
        holder = threading.Thread(
            target=lambda: client.post(
                server.url + "/v1/systemone", json=steered("von", 2.0, "holder")
            )
        )
        holder.start()
        holding_the_slot(server, "holder")
        # laya needs von's slot: it waits in residency's queue, then its client hangs up
        hang_up_when_queued(server, steered("laya", 0.0, "gone"))
        wait_until(lambda: cancelled(server) == 1, "the hang-up counted as a cancellation")
        holder.join()
        after = client.post(server.url + "/v1/systemone", json=steered("laya", 0.0, "after"))
    assert after.status_code == 200
    tags = [event["tag"] for event in server.events()]
    assert "gone" not in tags  # it never ran
    assert server.metric("decidealot_decisions_total", provider="laya", outcome="cancelled") == 1
    assert any('" 499 ' in line or " 499 " in line for line in server.log_lines())


async def give_up_when_queued(server: RunningServer, caller: anyio.CancelScope) -> None:
    await anyio.to_thread.run_sync(
        wait_until, lambda: pending(server) == 2, "the call queued behind the holder"
    )
    caller.cancel()


async def test_a_cancelled_mcp_tool_call_is_withdrawn(
    launch: Callable[..., RunningServer],
) -> None:
    server = launch(**ALL_FAKES, DECIDEALOT_MAX_RESIDENT_PROVIDERS="1")
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(f"{server.url}/mcp", http_client=http)) as client,
    ):
        async with anyio.create_task_group() as group:
            group.start_soon(client.call_tool, "system_one", steered("von", 2.0, "holder"))
            await anyio.to_thread.run_sync(holding_the_slot, server, "holder")
            with anyio.CancelScope() as caller:
                # the caller gives up once the call is queued: the SDK cancels the request
                group.start_soon(give_up_when_queued, server, caller)
                await client.call_tool("system_one", steered("laya", 0.0, "gone"))
            assert caller.cancelled_caught, "the call was answered before its caller gave up"
        await anyio.to_thread.run_sync(
            wait_until, lambda: cancelled(server) == 1, "the MCP cancellation counted"
        )
        result = await client.call_tool("system_one", steered("laya", 0.0, "after"))
        assert not result.is_error
    assert "gone" not in [event["tag"] for event in server.events()]
