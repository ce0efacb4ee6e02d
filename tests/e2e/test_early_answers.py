"""An answer given before the body has arrived (401 for a missing key) reaches a client that
is still sending, over a real server.

The gateway answers 401 before reading any of the body. A server that then closes the
connection with the body still coming makes the kernel reset it: the client's next write
fails (EPIPE or ECONNRESET), and a client that gives up on a failed write, or a reset that
overtakes the answer on a real network, loses the 401. So the gateway reads and drops the rest
of the body (bounded, as after an early 413) before the connection ends. The clients here send
12 MiB, past the socket buffers on both ends (the server reads nothing, so its receive buffer
stays near net.ipv4.tcp_rmem's default), slowly (a pause after every 64 KiB) and quickly.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers import RunningServer, start_server

LENGTH = 12 * 1024 * 1024
"""Past the default 2 MiB body limit and within the 8 limits read and dropped after an early
answer (`decidealot.asgi.body.Incoming.discard`)."""
PIECE = 64 * 1024
RUNS = 3


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("early"), DECIDEALOT_API_KEY="early-k3y-early")
    yield server
    assert server.stop() == 0


def raw_post(url: str, path: str, pause: float) -> tuple[str | None, bytes]:
    """POST `LENGTH` bytes without a key over a plain socket, writing all of it before reading
    (a pause of `pause` s after each piece); (why a write failed or None, what was read)."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Length: {LENGTH}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert 2 * sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < LENGTH
        failed = None
        try:
            sock.sendall(head)
            for _ in range(LENGTH // PIECE):
                sock.sendall(b" " * PIECE)
                if pause:
                    time.sleep(pause)
        except OSError as exc:  # the connection was reset under the client
            failed = type(exc).__name__
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply:
                    break
        except OSError as exc:
            failed = failed or f"read: {type(exc).__name__}"
    return failed, reply


def slowly() -> Iterator[bytes]:
    for _ in range(LENGTH // PIECE):
        yield b" " * PIECE
        time.sleep(0.001)


@pytest.mark.parametrize("path", ["/v1/systemone", "/mcp"])
@pytest.mark.parametrize("pause", [0.001, 0.0], ids=["slow", "fast"])
def test_a_sender_still_writing_reads_the_401_without_a_reset(
    keyed: RunningServer, path: str, pause: float
) -> None:
    outcomes = [raw_post(keyed.url, path, pause) for _ in range(RUNS)]
    for failed, reply in outcomes:
        assert failed is None, (failed, reply[:200])
        assert reply.startswith(b"HTTP/1.1 401"), reply[:200]


@pytest.mark.parametrize("path", ["/v1/systemone", "/mcp"])
def test_httpx_streaming_a_large_body_slowly_reads_the_401(keyed: RunningServer, path: str) -> None:
    headers = {"Content-Type": "application/json", "Content-Length": str(LENGTH)}
    for _ in range(RUNS):
        response = httpx.post(keyed.url + path, content=slowly(), headers=headers, timeout=60)
        assert response.status_code == 401
        assert response.json()["code"] == "UNAUTHORIZED"
