"""The MCP transport rules the SDK leaves to us, over real servers and `decidealot mcp`:

1. a 2026-07-28 request whose MCP-Protocol-Version header disagrees with its `_meta` version
   (or is absent) is 400 HeaderMismatch (-32020), not served as a 2025 request;
2. `server/discover` and every -32022 name each version served, 2024-11-05 to 2026-07-28, and
   a request whose header names none of them is told -32022;
3. a message that is not JSON gets a JSON-RPC parse error (-32700), on stdio as over HTTP;
4. a batch is refused with a JSON-RPC error that says why, under 2025-03-26 too;
5. without a key the well-known OAuth paths answer 404, and the 401's challenge tells a
   missing key (`Bearer`) from a wrong one (`error="invalid_token"`);
6. `decidealot mcp --url` hands back the server's own 413 for arguments over its limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from decidealot.errors import RequestTooLarge
from tests.support.mcp_clients import (
    StdioServer,
    forwarding,
    in_tool_terms,
    over_stdio,
    tool_outcome,
)
from tests.support.servers import RunningServer, start_server

SERVED = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"]
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
API_KEY = "transport-k3y"


def modern(method: str, version: str = "2026-07-28", request_id: int = 3) -> dict[str, Any]:
    """A 2026-07-28 request: its version and capabilities in `_meta`."""
    meta = {PROTOCOL_VERSION: version, CAPABILITIES: {}}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"_meta": meta}}


def post(server: RunningServer, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = HEADERS | (headers or {})
    return httpx.post(f"{server.url}/mcp", content=content, headers=sent, timeout=30)


def refused(response: httpx.Response, code: int, request_id: Any = None) -> dict[str, Any]:
    """The JSON-RPC error in a 400 (404 for an unknown method)."""
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == request_id, body
    assert body["error"]["code"] == code, body
    return body["error"]


@pytest.fixture(scope="module")
def stdio(
    gateway: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StdioServer]:
    """`decidealot mcp --url` after an initialize that negotiated 2025-03-26."""
    with forwarding(gateway.url, tmp_path_factory.mktemp("mcp-rules"), "2025-03-26") as server:
        yield server


# -- 1 -----------------------------------------------------------------------------------------


def test_a_2026_request_under_another_header_is_a_header_mismatch(gateway: RunningServer) -> None:
    listing = modern("tools/list")
    for headers in (
        {"MCP-Protocol-Version": "2025-06-18", "Mcp-Method": "tools/list"},
        {"MCP-Protocol-Version": "2025-03-26"},
        {},
    ):
        error = refused(post(gateway, listing, headers), -32020, request_id=3)
        assert "mcp-protocol-version header does not match" in error["message"]
    agreeing = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}
    served = post(gateway, listing, agreeing)
    assert served.status_code == 200, served.text
    assert served.json()["result"]["tools"][0]["name"] == "system_one"


# -- 2 -----------------------------------------------------------------------------------------


def test_every_served_version_is_named(gateway: RunningServer, stdio: StdioServer) -> None:
    discover = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"}
    answer = post(gateway, modern("server/discover"), discover)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["supportedVersions"] == SERVED

    future = {"MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "tools/list"}
    error = refused(post(gateway, modern("tools/list", "2099-01-01"), future), -32022, 3)
    assert error["data"] == {"supported": SERVED, "requested": "2099-01-01"}
    stdio.send(modern("tools/list", "2099-01-01", request_id=5))
    assert stdio.answer(5) == {"jsonrpc": "2.0", "id": 5, "error": error}

    legacy = {"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}}
    unknown = {"MCP-Protocol-Version": "2099-01-01"}
    error = refused(post(gateway, legacy, unknown), -32022, 4)
    assert error["data"] == {"supported": SERVED, "requested": "2099-01-01"}
    assert "2099-01-01" in error["message"] and "2025-11-25" in error["message"]
    for version in SERVED[:4]:  # each handshake version is served as before
        served = post(gateway, legacy, {"MCP-Protocol-Version": version})
        assert served.status_code == 200, (version, served.text)


# -- 3 and 4 -----------------------------------------------------------------------------------

UNPARSABLE = [b'{"jsonrpc": "2.0", "id": 9, "method": ', b"not json at all", b'"caf\xe9']
BATCH = [
    {"jsonrpc": "2.0", "id": 11, "method": "ping"},
    {"jsonrpc": "2.0", "id": 12, "method": "tools/list"},
]


def test_unparsable_messages_get_a_parse_error(gateway: RunningServer, stdio: StdioServer) -> None:
    for line in UNPARSABLE:
        over_http = refused(post(gateway, line), -32700)
        over_stdio = stdio.send_line(line)
        assert over_stdio == {"jsonrpc": "2.0", "id": None, "error": over_http}, line
        assert over_http["message"].startswith("Parse error")
    assert "result" in stdio.call("ping", {})  # the session goes on
    assert "Traceback" not in stdio.log()


def test_batches_are_refused_saying_why(gateway: RunningServer, stdio: StdioServer) -> None:
    """Under 2025-03-26 (negotiated on stdio, the header over HTTP), whose transport allowed
    batches, as under later versions, which have none."""
    for version in ("2025-03-26", "2025-06-18", None):
        headers = {"MCP-Protocol-Version": version} if version else {}
        error = refused(post(gateway, BATCH, headers), -32600)
        assert "batches are not accepted" in error["message"] and "2025-03-26" in error["message"]
    over_stdio = stdio.send_line(json.dumps(BATCH).encode())
    assert over_stdio == {"jsonrpc": "2.0", "id": None, "error": error}
    assert stdio.send_line(b"[]")["error"]["code"] == -32600
    assert "result" in stdio.call("tools/list", {})


# -- 5 -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("mcp-rules-keyed"), DECIDEALOT_API_KEY=API_KEY)
    yield server
    assert server.stop() == 0


WELL_KNOWN = [
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-authorization-server",
    "/.well-known/openid-configuration",
]


def test_no_oauth_and_a_challenge_that_tells_missing_from_wrong(keyed: RunningServer) -> None:
    for path in WELL_KNOWN:
        for headers in ({}, {"Authorization": f"Bearer {API_KEY}"}):
            response = httpx.get(keyed.url + path, headers=headers)
            assert response.status_code == 404, (path, headers, response.text)
            assert response.json()["code"] == "NOT_FOUND"
            assert "www-authenticate" not in response.headers

    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    missing = post(keyed, listing)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    for wrong in ("Bearer wrong-key", f"Basic {API_KEY}", ""):
        response = post(keyed, listing, {"Authorization": wrong})
        assert response.status_code == 401, wrong
        assert response.json()["code"] == "UNAUTHORIZED"
        assert response.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
    assert post(keyed, listing, {"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert httpx.get(keyed.url + "/v1/models").headers["www-authenticate"] == "Bearer"


# -- 6 -----------------------------------------------------------------------------------------

TOO_LARGE = {"code": "REQUEST_TOO_LARGE", "message": RequestTooLarge.message, "details": {}}


def _decision(size: int) -> dict[str, Any]:
    return {"model": "laya", "state": "x" * size, "questions": {"q": {"type": "noul"}}}


async def test_forwarding_hands_back_the_servers_413(gateway: RunningServer) -> None:
    """At the default 2 MiB limit, arguments of 2.15 MB and 5 MB: the server answers 413 before
    reading them; every call gets that answer, none an unreachable server."""
    async with over_stdio(["--url", gateway.url], {}) as client:
        for size in (2_150_000, 5_000_000):
            for _ in range(4):
                result = await client.call_tool("system_one", _decision(size))
                assert tool_outcome(result) == (True, in_tool_terms(TOO_LARGE))


async def test_a_client_that_writes_before_it_reads_gets_the_413(gateway: RunningServer) -> None:
    """httpx's async client writes the whole body before reading: the REST API and /mcp answer
    it 413, not a reset connection."""
    body = json.dumps(_decision(5_000_000)).encode()
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    message = json.dumps(call | {"params": {"name": "system_one", "arguments": {}}})
    mcp_body = message.replace('"arguments": {}', '"arguments": ' + body.decode()).encode()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as api:
        for path, content in (("/v1/systemone", body), ("/mcp", mcp_body)):
            answers = await asyncio.gather(
                *(api.post(path, content=content, headers=HEADERS) for _ in range(4))
            )
            assert [a.status_code for a in answers] == [413] * 4, path
            assert all(a.json() == TOO_LARGE for a in answers)
