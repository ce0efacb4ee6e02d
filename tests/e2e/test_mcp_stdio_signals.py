"""`decidealot mcp` ends on SIGINT (Ctrl-C) and SIGTERM while its client still holds stdin open.

The SDK reads stdin on a worker thread that only a line or EOF wakes, so a shutdown that waits
for that thread never ends; these tests keep the pipe open on purpose. The second test lets the
process start a real provider worker (a tiny random Von checkpoint) and checks it is gone too.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from decidealot.mcp.tools import TOOLS
from tests.support import ops_launcher as ops_server
from tests.support.checkpoints import TinyCheckpoints
from tests.support.mcp_clients import StdioServer

ROOT = Path(__file__).resolve().parents[2]
EXIT_SECONDS = 5.0


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
    servers: list[StdioServer], tmp_path: Path, tiny: TinyCheckpoints
) -> None:
    checkpoint = tiny.von(independent_options=False)
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
