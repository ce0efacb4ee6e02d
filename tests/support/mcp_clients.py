"""MCP clients for tests: the official SDK's client over streamable HTTP and over stdio, a raw
stdio speaker for what the SDK will not send (signals, odd lines), how a tool result reads
(`tool_outcome`), and the reading of a raw `POST /mcp` answer (`sse_json`). The TypeScript SDK
and the Inspector are in `tests.support.node_clients`."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from tests.support.servers import ROOT

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
"""What a raw `POST /mcp` sends: the SDK's transport wants both media types accepted."""


def sse_json(response: httpx.Response) -> Any:
    """The JSON-RPC message a raw `POST /mcp` answered with: its first server-sent event."""
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(data[0])


def tool_outcome(result: CallToolResult | dict[str, Any]) -> tuple[bool, Any]:
    """A `tools/call` result (the SDK's, or as JSON) as (is_error, body): a result's structured
    content, which its one text block repeats; an error's text block, the envelope, and no
    structured content (docs/mcp.md says why)."""
    if not isinstance(result, dict):
        result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    [block] = result["content"]
    body = json.loads(block["text"])
    if result.get("isError", False):
        assert "structuredContent" not in result, result
        return True, body
    assert result["structuredContent"] == body, result
    return False, body


def in_tool_terms(envelope: Any) -> Any:
    """An HTTP API error envelope as an MCP client is told it: routes named as the tools."""
    return json.loads(json.dumps(envelope).replace("GET /v1/models", "list_models"))


@asynccontextmanager
async def over_http(
    url: str, headers: dict[str, str] | None = None, mode: str = "auto"
) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=30) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


def over_stdio(args: list[str], env: dict[str, str], mode: str = "legacy") -> Client:
    """`decidealot mcp ...` as a subprocess, the way an IDE starts it."""
    child_env = {
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "DECIDEALOT_LOG_LEVEL": "warning",
        **env,
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "decidealot", "mcp", *args], env=child_env, cwd=ROOT
    )
    return Client(params, mode=mode)


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
        return self.answer(self._next_id, timeout)

    def call_raw(self, message: bytes, timeout: float = 60) -> dict[str, Any]:
        """Send `message` (one JSON-RPC request, as raw bytes) and return its result."""
        request_id = json.loads(message.decode(errors="replace"))["id"]
        assert self.process.stdin is not None
        self.process.stdin.write(message + b"\n")
        self.process.stdin.flush()
        answer = self.answer(request_id, timeout)
        assert "result" in answer, answer
        return answer["result"]

    def send_line(self, line: bytes, timeout: float = 60) -> dict[str, Any]:
        """Send one raw line; the error answered to it (JSON-RPC's id null: no id was read)."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()
        return self.answer(None, timeout)

    def write_line(self, line: bytes) -> None:
        """Send `line` as it is, whatever it holds."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def answers(self, ids: list[object], timeout: float = 30) -> list[dict[str, Any]]:
        """What the server writes until every answer in `ids` (repeats included) has come."""
        expected, seen = Counter(map(repr, ids)), Counter[str]()
        answers: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while not expected <= seen:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"unanswered: {expected - seen}") from None
            answers.append(json.loads(line))
            if "method" not in answers[-1]:
                seen[repr(answers[-1].get("id"))] += 1
        return answers

    def answer(self, request_id: int | None, timeout: float = 60) -> dict[str, Any]:
        """The next answer to `request_id` (None: to a message whose id could not be read)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = json.loads(self._lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
            if answer.get("id") == request_id and ("method" not in answer):
                return answer

    def initialize(self, version: str = "2025-06-18") -> None:
        answer = self.call(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "signals-test", "version": "0"},
            },
        )
        assert answer["result"]["protocolVersion"] == version, answer
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def log(self) -> str:
        return self.stderr.read_text()


@contextmanager
def forwarding(url: str, folder: Path, version: str = "2025-06-18") -> Iterator[StdioServer]:
    """`decidealot mcp --url <url>` spoken to raw, initialized at `version`; killed after."""
    server = StdioServer(["--url", url], {}, folder / "stderr.log")
    try:
        server.initialize(version)
        yield server
    finally:
        server.process.kill()
        server.process.wait()
        if server.process.stdin is not None:
            server.process.stdin.close()
