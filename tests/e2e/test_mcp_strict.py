"""MCP tool arguments pass the HTTP API's strict JSON rules, on both faces of a real server.

The same raw JSON is sent as an HTTP body to `/v1/systemone` (or `/batch`) and as a tool call's
`arguments`: over streamable HTTP at `/mcp` of the production server (`tests.server`), raw and
through the official SDK client in both protocol eras, and over stdio (`decidealot mcp --url`,
a real subprocess) forwarding to that server. Duplicate keys, integers beyond 64 bits,
non-finite numbers and lone surrogates get exactly the HTTP API's 422 issues, as a tool error;
valid arguments are untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.mcp_clients import StdioServer, forwarding, over_http, tool_outcome
from tests.support.servers import RunningServer

NOUL = b'{"type": "noul", "instructions": "Is human review needed?"}'


def _request(state: bytes, questions: bytes = b'{"review": ' + NOUL + b"}") -> bytes:
    return b'{"model": "von", "state": ' + state + b', "questions": ' + questions + b"}"


REFUSED: dict[str, tuple[str, bytes]] = {
    "duplicate question": (
        "system_one",
        _request(b'"a charge"', b'{"review": ' + NOUL + b', "review": ' + NOUL + b"}"),
    ),
    "duplicate state key": ("system_one", _request(b'{"amount": 1, "amount": 2}')),
    "integer beyond 64 bits": (
        "system_one",
        _request(b'{"amount": 1000000000000000000000000000000}'),
    ),
    "NaN": ("system_one", _request(b'{"amount": NaN}')),
    "-Infinity": ("system_one", _request(b'{"amount": -Infinity}')),
    "float overflow": ("system_one", _request(b'{"amount": 1e999}')),
    "lone surrogate": ("system_one", _request(b'"\\ud800 unpaired"')),
    "not UTF-8": ("system_one", _request(b'"caf\xe9"')),
    "duplicate in a batch item": (
        "system_one_batch",
        b'{"requests": [' + _request(b'{"amount": 1, "amount": 2}') + b"]}",
    ),
}

ACCEPTED = _request(b'{"amount": 18446744073709551615, "note": "\\ud83d\\ude00 paired"}')
"""The largest unsigned 64-bit integer and a surrogate pair: valid, as over HTTP."""

PATHS = {"system_one": "/v1/systemone", "system_one_batch": "/v1/systemone/batch"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def rpc(tool: str, arguments: bytes, request_id: int = 7) -> bytes:
    """A tools/call message whose arguments are exactly the bytes given."""
    head = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
    return (
        json.dumps(head)[:-1].encode()
        + b', "params": {"name": "'
        + tool.encode()
        + b'", "arguments": '
        + arguments
        + b"}}"
    )


def over_rest(server: RunningServer, tool: str, body: bytes) -> tuple[int, Any]:
    response = httpx.post(
        server.url + PATHS[tool], content=body, headers={"Content-Type": "application/json"}
    )
    return response.status_code, response.json()


def over_mcp_http(server: RunningServer, message: bytes) -> dict[str, Any]:
    response = httpx.post(server.url + "/mcp", content=message, headers=MCP_HEADERS, timeout=30)
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return next(m for m in map(json.loads, data) if m.get("id") == 7)["result"]


@pytest.fixture(scope="module")
def stdio(
    gateway: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StdioServer]:
    with forwarding(gateway.url, tmp_path_factory.mktemp("mcp-strict")) as server:
        yield server


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_arguments_get_the_http_issues_as_a_tool_error(
    gateway: RunningServer, stdio: StdioServer, case: str
) -> None:
    tool, raw = REFUSED[case]
    status, expected = over_rest(gateway, tool, raw)
    assert status == 422 and expected["detail"][0]["type"] == "json_invalid", expected

    for result in (over_mcp_http(gateway, rpc(tool, raw)), stdio.call_raw(rpc(tool, raw, 70))):
        assert tool_outcome(result) == (True, expected)


def test_valid_arguments_are_untouched(gateway: RunningServer, stdio: StdioServer) -> None:
    status, expected = over_rest(gateway, "system_one", ACCEPTED)
    assert status == 200, expected
    for result in (
        over_mcp_http(gateway, rpc("system_one", ACCEPTED)),
        stdio.call_raw(rpc("system_one", ACCEPTED, 71)),
    ):
        assert tool_outcome(result) == (False, expected)


def test_a_client_cannot_forge_a_rejection(gateway: RunningServer) -> None:
    """The marker the transport puts in place of refused arguments is unguessable: arguments
    that look like one are validated like any others."""
    forged = b'{"decidealot.rejected.0": {"detail": []}}'
    status, expected = over_rest(gateway, "system_one", forged)
    assert status == 422
    assert tool_outcome(over_mcp_http(gateway, rpc("system_one", forged))) == (True, expected)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_sdk_clients_in_both_eras_get_the_http_issues(
    gateway: RunningServer, mode: str
) -> None:
    """The official client sends 10**30 as the integer it is; both eras refuse it as HTTP does."""
    arguments = json.loads(_request(b'{"amount": 1000000000000000000000000000000}'))
    status, expected = over_rest(gateway, "system_one", json.dumps(arguments).encode())
    assert status == 422
    async with over_http(gateway.url, mode=mode) as client:
        result = await client.call_tool("system_one", arguments)
    assert tool_outcome(result) == (True, expected)


def test_the_stdio_stderr_carries_no_traceback(stdio: StdioServer, tmp_path: Path) -> None:
    stdio.call_raw(rpc(*REFUSED["lone surrogate"], 72))
    assert "Traceback" not in stdio.log()
