"""`/mcp` reads POST bodies under the REST API's rules, over a real server (`tests.server`).

gzip and zstd bodies reach the tools; bodies over the limit (as sent, streamed, or decoded
from a bomb), corrupt, slow, or in an unknown encoding or media type get the REST API's JSON
error envelope; tool arguments up to DECIDEALOT_MAX_REQUEST_BYTES still fit with the JSON-RPC
framing around them. MCP-specific checks (Accept, Host) stay the SDK's.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgspec
import pytest
import zstandard

from decidealot.mcp.http import _FRAMING_BYTES
from decidealot.mcp.tools import TOOLS
from tests.support.mcp_clients import tool_outcome
from tests.support.servers import RunningServer, start_server

LIMIT = 16 * 1024
READ_TIMEOUT = 1.0
MCP_LIMIT = LIMIT + _FRAMING_BYTES
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

DECISION: dict[str, Any] = {
    "model": "von-1.1.0",
    "state": {"operation": "delete", "reversible": False},
    "questions": {"review": {"type": "noul", "instructions": "Is human review needed?"}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("mcp-body"),
        DECIDEALOT_MAX_REQUEST_BYTES=str(LIMIT),
        DECIDEALOT_REQUEST_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT),
    )
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def rpc(method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).encode()


def call(tool: str, arguments: dict[str, Any]) -> bytes:
    return rpc("tools/call", {"name": tool, "arguments": arguments})


def answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer to request 7, from the SDK's event-stream response."""
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return next(m for m in map(json.loads, data) if m.get("id") == 7)


def envelope(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"code", "message", "details"} and body["code"] == code, body
    return body


def exchange(server: RunningServer, framing: bytes, feed: Callable[[socket.socket], None]) -> bytes:
    """A raw POST /mcp (head with `framing`, then `feed`): the reply, read until the server
    closes. Raw, because the server answers 413 before reading the body and closes, and a
    client still writing may then lose the reply."""
    port = int(server.url.rsplit(":", 1)[1])
    head = (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nConnection: close\r\n"
    )
    reply = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + framing + b"\r\n")
        with contextlib.suppress(OSError):  # the server may close once it has answered
            feed(sock)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                reply += chunk
    return reply


def padded(size: int) -> dict[str, Any]:
    """DECISION with a state string that makes its JSON exactly `size` bytes."""
    bare = len(msgspec.json.encode({**DECISION, "state": ""}))
    arguments = {**DECISION, "state": "x" * (size - bare)}
    assert len(msgspec.json.encode(arguments)) == size
    return arguments


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_compressed_bodies_reach_the_tools(client: httpx.Client, encoding: str) -> None:
    compress = gzip.compress if encoding == "gzip" else zstandard.ZstdCompressor().compress
    sent = HEADERS | {"Content-Encoding": encoding}

    tools = answer(client.post("/mcp", content=compress(rpc("tools/list", {})), headers=sent))
    assert [tool["name"] for tool in tools["result"]["tools"]] == list(TOOLS)
    expected = client.post("/v1/systemone", json=DECISION)
    assert expected.status_code == 200, expected.text
    result = answer(
        client.post("/mcp", content=compress(call("system_one", DECISION)), headers=sent)
    )
    assert result["result"]["isError"] is False
    assert result["result"]["structuredContent"] == expected.json()


def test_arguments_up_to_the_limit_fit_in_the_framing(
    server: RunningServer, client: httpx.Client
) -> None:
    arguments = padded(LIMIT)
    expected = client.post("/v1/systemone", json=arguments)
    assert expected.status_code == 200, expected.text
    body = call("system_one", arguments)
    assert LIMIT < len(body) < MCP_LIMIT
    result = answer(client.post("/mcp", content=body, headers=HEADERS))
    assert result["result"]["isError"] is False, result
    assert result["result"]["structuredContent"] == expected.json()
    # one byte more is the tool's REQUEST_TOO_LARGE, as POST /v1/systemone answers it
    over = answer(
        client.post("/mcp", content=call("system_one", padded(LIMIT + 1)), headers=HEADERS)
    )
    failed, envelope = tool_outcome(over["result"])
    assert failed and envelope["code"] == "REQUEST_TOO_LARGE"
    assert "x" * 64 not in server.log_file.read_text()  # no log line holds the state


def test_oversized_bodies_get_the_json_413(server: RunningServer, client: httpx.Client) -> None:
    declared = exchange(server, b"Content-Length: %d\r\n" % (MCP_LIMIT + 1), lambda sock: None)
    assert declared.startswith(b"HTTP/1.1 413"), declared
    assert json.loads(declared.partition(b"\r\n\r\n")[2])["code"] == "REQUEST_TOO_LARGE"

    def chunks(sock: socket.socket) -> None:  # ~2 x MCP_LIMIT offered, no Content-Length
        for _ in range(2 * MCP_LIMIT // 0x4000 + 1):
            sock.sendall(b"4000\r\n" + b" " * 0x4000 + b"\r\n")

    streamed = exchange(server, b"Transfer-Encoding: chunked\r\n", chunks)
    assert streamed.startswith(b"HTTP/1.1 413"), streamed
    assert json.loads(streamed.partition(b"\r\n\r\n")[2])["code"] == "REQUEST_TOO_LARGE"

    bomb = b" " * (4 * MCP_LIMIT)
    for encoding, packed in (
        ("gzip", gzip.compress(bomb)),
        ("zstd", zstandard.ZstdCompressor().compress(bomb)),
    ):
        assert len(packed) < LIMIT
        sent = HEADERS | {"Content-Encoding": encoding}
        decoded = envelope(
            client.post("/mcp", content=packed, headers=sent), 413, "REQUEST_TOO_LARGE"
        )
        assert decoded["message"] == "the decoded request body exceeds the size limit"


def test_undecodable_bodies(client: httpx.Client) -> None:
    packed = gzip.compress(rpc("tools/list", {}))
    corrupt = packed[:12] + bytes(b ^ 0xFF for b in packed[12:])
    for broken, message in (
        (corrupt, "the gzip body is corrupt"),
        (packed[:-9], "the gzip body is truncated"),
    ):
        response = client.post(
            "/mcp", content=broken, headers=HEADERS | {"Content-Encoding": "gzip"}
        )
        assert envelope(response, 400, "MALFORMED_BODY")["message"] == message
    zstd = client.post(
        "/mcp", content=b"not zstd at all", headers=HEADERS | {"Content-Encoding": "zstd"}
    )
    envelope(zstd, 400, "MALFORMED_BODY")

    brotli = client.post("/mcp", content=packed, headers=HEADERS | {"Content-Encoding": "br"})
    envelope(brotli, 415, "UNSUPPORTED_CONTENT_ENCODING")
    text = client.post(
        "/mcp", content=rpc("tools/list", {}), headers=HEADERS | {"Content-Type": "text/plain"}
    )
    envelope(text, 415, "UNSUPPORTED_MEDIA_TYPE")


def test_mcp_header_checks_stay_the_sdks(client: httpx.Client) -> None:
    plain = rpc("tools/list", {})
    no_accept = client.post("/mcp", content=plain, headers=HEADERS | {"Accept": "text/html"})
    assert no_accept.status_code == 406
    evil = client.post(
        "/mcp",
        content=gzip.compress(plain),
        headers=HEADERS | {"Host": "evil.example", "Content-Encoding": "gzip"},
    )
    assert evil.status_code == 421
    # GET: stateless sessions have no event stream to open (the MCP spec allows a 405)
    stream = client.get("/mcp", headers={"Accept": "text/event-stream"})
    assert stream.status_code == 405 and stream.headers["allow"] == "POST"


def test_a_slow_body_is_408(server: RunningServer) -> None:
    started = time.monotonic()
    reply = exchange(server, b"Content-Length: 100\r\n", lambda sock: sock.sendall(b"{"))
    waited = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["code"] == "REQUEST_TIMEOUT"
    assert READ_TIMEOUT * 0.9 < waited < READ_TIMEOUT + 5
