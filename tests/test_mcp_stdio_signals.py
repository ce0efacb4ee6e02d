"""`decidealot mcp` ends on SIGINT (Ctrl-C) and SIGTERM while its client still holds stdin open.

The SDK reads stdin on a worker thread that only a line or EOF wakes, so a shutdown that waits
for that thread never ends; these tests keep the pipe open on purpose. The second test lets the
process start a real provider worker (a tiny random Von checkpoint) and checks it is gone too.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from decidealot.mcp.tools import TOOLS
from tests import ops_server

ROOT = Path(__file__).resolve().parent.parent
EXIT_SECONDS = 5.0


class StdioServer:
    """`python -m decidealot mcp ...` with pipes, spoken to one JSON-RPC line at a time."""

    def __init__(self, args: list[str], env: dict[str, str], stderr: Path) -> None:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
        with stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "decidealot", "mcp", *args],
                cwd=ROOT,
                env=clean | {"DECIDEALOT_LOG_LEVEL": "info", **env},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.stderr = stderr
        self._lines: queue.Queue[bytes] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        self._next_id = 0

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            self._lines.put(line)

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def call(self, method: str, params: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        self._next_id += 1
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        return self._answer(self._next_id, timeout)

    def call_raw(self, message: bytes, timeout: float = 60) -> dict[str, Any]:
        """Send `message` (one JSON-RPC request, as raw bytes) and return its result."""
        request_id = json.loads(message.decode(errors="replace"))["id"]
        assert self.process.stdin is not None
        self.process.stdin.write(message + b"\n")
        self.process.stdin.flush()
        answer = self._answer(request_id, timeout)
        assert "result" in answer, answer
        return answer["result"]

    def _answer(self, request_id: int, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            answer = json.loads(self._lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
            if answer.get("id") == request_id:
                return answer

    def initialize(self) -> None:
        answer = self.call(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "signals-test", "version": "0"},
            },
        )
        assert "result" in answer, answer
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def log(self) -> str:
        return self.stderr.read_text()


@pytest.fixture
def servers() -> Iterator[list[StdioServer]]:
    started: list[StdioServer] = []
    yield started
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
        if server.process.stdin is not None:
            server.process.stdin.close()


def ends_in_time(server: StdioServer, signum: signal.Signals) -> int:
    """Send `signum` with stdin still open; the exit status, failing if it takes too long."""
    server.process.send_signal(signum)
    try:
        return server.process.wait(EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {EXIT_SECONDS} s after {signum.name}: {server.log()[-2000:]}")


def unreachable_url() -> str:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_forwarding_ends_on_a_signal_with_stdin_open(
    servers: list[StdioServer], tmp_path: Path, signum: signal.Signals
) -> None:
    server = StdioServer(["--url", unreachable_url()], {}, tmp_path / "stderr.log")
    servers.append(server)
    server.initialize()
    tools = server.call("tools/list", {})
    assert [tool["name"] for tool in tools["result"]["tools"]] == list(TOOLS)

    assert ends_in_time(server, signum) == 0
    assert "Traceback" not in server.log()


def test_providers_and_workers_are_closed_on_sigint(
    servers: list[StdioServer], tmp_path: Path
) -> None:
    from decidealot.providers.tiny.von import build_von_checkpoint  # torch: only in this test

    checkpoint = build_von_checkpoint(tmp_path / "von", independent_options=False)
    env = {
        "DECIDEALOT_MODEL_DIR": str(tmp_path / "models"),
        "DECIDEALOT_LAYA_ENABLED": "false",
        "DECIDEALOT_VON_CHECKPOINT": str(checkpoint),
        "DECIDEALOT_DEVICE": "cpu",
    }
    server = StdioServer([], env, tmp_path / "stderr.log")
    servers.append(server)
    server.initialize()
    decision = {
        "model": "von",
        "state": "A duplicate card payment.",
        "questions": {"review": {"type": "noul", "instructions": "Is human review needed?"}},
    }
    answer = server.call("tools/call", {"name": "system_one", "arguments": decision})
    assert answer["result"]["isError"] is False, answer
    workers = ops_server.children(server.process.pid)
    assert len(workers) == 1

    assert ends_in_time(server, signal.SIGINT) == 0
    assert not any(ops_server.running(worker) for worker in workers)
    assert "MCP over stdio stopped" in server.log()
    assert "Traceback" not in server.log()
