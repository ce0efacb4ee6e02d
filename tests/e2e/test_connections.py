"""The HTTP edge as a careless or hostile client tries it, with raw sockets against the real
`decidealot serve` on tiny checkpoints with a key: a thousand idle connections, two hundred
slow headers, and the framing attacks of request smuggling and oversized heads. Nobody is
locked out: `/health` on a new connection answers within 1 s and a decision within 3 s while
they are held (bounds on liveness, never on speed), and the server's file descriptors come back
to where they were once the clients close. Counts and waits are bounded: the whole file takes
about a minute.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.servers import RunningServer, start_server, wait_until

KEY = "edge-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
IDLE = 1000
SLOW = 200
DRIP_SECONDS = 2.0
HEADER_READ_TIMEOUT = 12.0
"""The server's DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS here (the default is 5 s): long enough
that the thousand idle connections are still held while the checks run, on a loaded machine
too."""
DECISION = {
    "model": "laya-english",
    "state": "I was charged twice for one order.",
    "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}},
}


@pytest.fixture(scope="module", autouse=True)
def client_sockets() -> None:
    """This process opens a thousand client sockets: raise its own open-file soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * IDLE if hard == resource.RLIM_INFINITY else min(4 * IDLE, hard)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < IDLE + 200:
        pytest.skip(f"the open-file hard limit ({hard}) is below {IDLE + 200} client sockets")


def serve_laya(folder: Path, tiny: TinyCheckpoints, **env: str) -> RunningServer:
    """`decidealot serve` of the tiny Laya checkpoints on CPU, with the key and `env`."""
    return start_server(
        folder,
        launcher="decidealot",
        args=("serve",),
        DECIDEALOT_API_KEY=KEY,
        DECIDEALOT_VON_ENABLED="false",
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        **laya_settings(tiny.laya_all()),
        **env,
    )


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyCheckpoints
) -> Iterator[RunningServer]:
    server = serve_laya(
        tmp_path_factory.mktemp("connections"),
        tiny,
        DECIDEALOT_WORKER_PASSES="1",
        DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS=str(HEADER_READ_TIMEOUT),
    )
    # the model loads once, before any flood: the decisions below measure the flood, not a load
    warm = httpx.post(server.url + "/v1/systemone", json=DECISION, headers=AUTH, timeout=120)
    assert warm.status_code == 200, warm.text
    yield server
    assert server.stop() == 0


def address(server: RunningServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def fds(server: RunningServer) -> int:
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def open_connections(server: RunningServer) -> float:
    """The server's count, less the connection this scrape itself is served on."""
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=5).text
    return (
        next(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "decidealot_open_connections"
        )
        - 1
    )


def assert_nobody_locked_out(server: RunningServer) -> None:
    """`/health` on a connection of its own within 1 s, a decision within 3 s (each a timeout:
    a locked-out client's connect or answer never comes)."""
    health = httpx.get(server.url + "/health", timeout=1)
    assert health.status_code == 200
    decision = httpx.post(server.url + "/v1/systemone", json=DECISION, headers=AUTH, timeout=3)
    assert decision.status_code == 200, decision.text


@contextlib.contextmanager
def connected(server: RunningServer, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections to `server`, each connected within 5 s, all closed at the end."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(socket.create_connection(address(server), timeout=5))
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def test_a_thousand_idle_connections_lock_nobody_out(served: RunningServer) -> None:
    before = fds(served)
    with connected(served, IDLE):
        wait_until(lambda: open_connections(served) >= IDLE, f"{IDLE} connections held", 10)
        # one descriptor per connection, give or take one the server is closing as we count
        assert abs(fds(served) - before - IDLE) <= 10
        assert_nobody_locked_out(served)
    wait_until(lambda: fds(served) <= before, "the descriptors back where they were", 10)


def test_idle_connections_are_closed_after_the_header_read_timeout(
    served: RunningServer,
) -> None:
    """Those that never sent a byte, and one kept alive after its answer."""
    before = fds(served)
    with connected(served, 51) as sockets:
        kept_alive, idle = sockets[0], sockets[1:]
        kept_alive.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept_alive.recv(4096).startswith(b"HTTP/1.1 200")
        for sock in [*idle, kept_alive]:  # the server closes each: the read sees the end
            sock.settimeout(HEADER_READ_TIMEOUT + 10)
            assert sock.recv(1) == b""
    wait_until(lambda: fds(served) <= before, "the descriptors back where they were", 10)


class Drip:
    """Slowloris: each connection sends a request head one byte every `DRIP_SECONDS`, from a
    thread, and records when the server closed it."""

    HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100

    def __init__(self, sockets: list[socket.socket]) -> None:
        self.sockets = sockets
        self.opened = time.monotonic()
        self.closed: dict[socket.socket, float] = {}
        self.answered: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Drip:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        for index in range(len(self.HEAD)):
            open_now = [s for s in self.sockets if s not in self.closed]
            if not open_now or self._stop.is_set():
                return
            for sock in open_now:
                with contextlib.suppress(OSError):  # closed under us: seen below
                    sock.send(self.HEAD[index : index + 1])
            deadline = time.monotonic() + DRIP_SECONDS
            while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                readable, _, _ = select.select(open_now, [], [], min(left, 0.1))
                for sock in readable:
                    self._read(sock)
                open_now = [s for s in open_now if s not in self.closed]

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except OSError:
            data = b""
        if data:
            self.answered.append(data)
        self.closed.setdefault(sock, time.monotonic() - self.opened)


def test_two_hundred_slow_headers_lock_nobody_out(served: RunningServer) -> None:
    before = fds(served)
    with connected(served, SLOW) as sockets, Drip(sockets) as drip:
        wait_until(lambda: open_connections(served) >= SLOW, f"{SLOW} connections held", 10)
        assert_nobody_locked_out(served)
        # the header read timeout frees each: none is answered (the head never completed)
        wait_until(
            lambda: len(drip.closed) == SLOW, "every slow header closed", HEADER_READ_TIMEOUT + 15
        )
        assert drip.answered == []
        held = sorted(drip.closed.values())
        assert held[0] >= HEADER_READ_TIMEOUT - 1  # dripping kept none past the timeout...
        assert held[-1] < HEADER_READ_TIMEOUT + 10  # ...and none much longer
    wait_until(lambda: fds(served) <= before, "the descriptors back where they were", 10)


# -- framing: what a smuggler sends, refused or closed; what a careful client sends, served --

SMUGGLED = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
"""Sent where a lenient parser would take the end of a body: answered, it would be a second
response on the connection."""


def post_head(*headers: bytes) -> bytes:
    auth = f"Authorization: Bearer {KEY}".encode()
    lines = [b"POST /v1/systemone HTTP/1.1", b"Host: x", auth, *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


REFUSED = {
    "content-length and transfer-encoding": post_head(
        b"Content-Length: 5", b"Transfer-Encoding: chunked"
    ) + b"0\r\n\r\n" + SMUGGLED,
    "transfer-encoding and content-length": post_head(
        b"Transfer-Encoding: chunked", b"Content-Length: 40"
    ) + b"0\r\n\r\n" + SMUGGLED,
    "two content-lengths": post_head(b"Content-Length: 0", b"Content-Length: 34") + SMUGGLED,
    "a negative content-length": post_head(b"Content-Length: -34") + SMUGGLED,
    "a chunk size that is no number": post_head(b"Transfer-Encoding: chunked")
    + b"zz\r\nabc\r\n0\r\n\r\n" + SMUGGLED,
    "a chunk size past 64 bits": post_head(b"Transfer-Encoding: chunked")
    + b"fffffffffffffffffff\r\nabc\r\n0\r\n\r\n" + SMUGGLED,
    "a 1 MiB header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**20 + b"\r\n\r\n",
    "1000 headers": b"GET /health HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-H%d: v\r\n" % i for i in range(1000)) + b"\r\n",
    "a 64 KiB target": b"GET /health?" + b"a" * 65536 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "a header name with a space": b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n",
}  # fmt: skip


def exchange(server: RunningServer, raw: bytes) -> bytes:
    """Send `raw`, read until the server closes (within its header read timeout)."""
    received = b""
    with socket.create_connection(address(server), timeout=HEADER_READ_TIMEOUT + 10) as sock:
        with contextlib.suppress(OSError):  # it may answer and close before all is sent
            sock.sendall(raw)
        with contextlib.suppress(OSError):  # a reset after the answer ends the read too
            while chunk := sock.recv(65536):
                received += chunk
    return received


def statuses(received: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", received)]


@pytest.mark.parametrize("raw", REFUSED.values(), ids=REFUSED.keys())
def test_a_smuggler_gets_one_refusal_and_no_second_answer(
    served: RunningServer, raw: bytes
) -> None:
    answers = statuses(exchange(served, raw))
    assert len(answers) <= 1, answers  # a second answer: the smuggled request was served
    assert all(400 <= status < 500 for status in answers), answers


def test_pipelined_requests_are_answered_in_order(served: RunningServer) -> None:
    raw = SMUGGLED + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    assert statuses(exchange(served, raw)) == [200, 401]  # /v1/models wants the key


def test_http_1_0_is_answered(served: RunningServer) -> None:
    received = exchange(served, b"GET /health HTTP/1.0\r\n\r\n")
    assert statuses(received) == [200]
    assert received.endswith(b'"status":"ok","providers":["laya"]}')


def test_a_lower_case_bearer_is_a_bearer(served: RunningServer) -> None:
    raw = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nauthorization: bearer {KEY}\r\n"
    assert statuses(exchange(served, raw.encode() + b"Connection: close\r\n\r\n")) == [200]


def test_expect_100_continue_gets_its_continue(served: RunningServer) -> None:
    body = httpx.Request("POST", "/", json=DECISION).read()
    head = post_head(
        b"Content-Type: application/json",
        b"Expect: 100-continue",
        b"Connection: close",
        b"Content-Length: %d" % len(body),
    )
    with socket.create_connection(address(served), timeout=10) as sock:
        sock.sendall(head)
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert statuses(received) == [200]


def test_the_probe_port_answers_probes_and_nothing_else(
    tmp_path: Path, tiny: TinyCheckpoints
) -> None:
    """DECIDEALOT_PROBE_PORT: /health and /metrics (behind the key, as on the API port) on a
    port of their own, reachable while the API port's connections are all taken."""
    from tests.support.servers import free_port

    probe_port = free_port()
    server = serve_laya(
        tmp_path, tiny, DECIDEALOT_MAX_CONNECTIONS="16", DECIDEALOT_PROBE_PORT=str(probe_port)
    )
    probes = f"http://127.0.0.1:{probe_port}"
    try:
        wait_until(lambda: _answers(probes + "/health"), "the probe port answering", 10)
        with connected(server, 16):  # every connection the API port holds, taken
            assert httpx.get(probes + "/health", timeout=1).status_code == 200
            metrics = httpx.get(probes + "/metrics", headers=AUTH, timeout=1)
            assert metrics.status_code == 200
            assert "decidealot_decisions_queued" in metrics.text
            assert httpx.get(probes + "/metrics", timeout=1).status_code == 401
            refused = httpx.post(probes + "/v1/systemone", json=DECISION, headers=AUTH)
            assert refused.status_code == 404
            assert "DECIDEALOT_PROBE_PORT" in refused.json()["message"]
    finally:
        assert server.stop() == 0


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False
