"""`decidealot mcp`'s stdio session at end of file, in process: every line read before the end
is answered before the session ends, a tool call still running at the end included.

The client here writes its lines and closes at once, as `printf ... | decidealot mcp` does.
The slow tool call waits for that end of file itself (an event the wire sets once its last
line is read), so it is provably still running when the input ends; nothing is timed.
tests/e2e/test_mcp_stdio_eof.py pipes the same into real processes, many times.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio

from decidealot import registry
from decidealot.mcp import stdio
from decidealot.mcp.server import Arguments, ServiceBackend
from decidealot.service import Service
from tests.support import fakes
from tests.support.servers import ALL_FAKES

SETTINGS = registry.from_env(ALL_FAKES)
NOUL = {"type": "noul", "instructions": "Is it?"}


def rpc(method: str, request_id: object, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


def call(request_id: object, tag: str) -> bytes:
    arguments = {"model": "laya", "state": {"fake": {"tag": tag}}, "questions": {"q": NOUL}}
    return rpc("tools/call", request_id, {"name": "system_one", "arguments": arguments})


OPENING = [
    rpc(
        "initialize",
        0,
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "eof", "version": "0"},
        },
    ),
    rpc("notifications/initialized", None),
]


class _Out:
    """The session's stdout: the JSON-RPC messages it writes."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def write(self, text: str) -> None:
        self.messages.extend(json.loads(line) for line in text.split("\n") if line)

    async def flush(self) -> None:
        pass

    def answered(self) -> Counter[str]:
        return Counter(repr(m.get("id")) for m in self.messages if "method" not in m)


class _Closing:
    """A client that writes its lines and closes its end at once; `ended` is set when the
    session has read the end of file."""

    def __init__(self, lines: list[bytes]) -> None:
        self._lines = lines
        self.ended = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for line in self._lines:
            yield line + b"\n"
        self.ended.set()


class _UntilEof(ServiceBackend):
    """Decisions tagged "at eof" run until the client's input has ended."""

    def __init__(self, service: Service, ended: asyncio.Event) -> None:
        super().__init__(service)
        self._ended = ended

    async def call(self, tool: str, arguments: Arguments) -> Any:
        state = arguments.get("state")
        if isinstance(state, dict) and state.get("fake", {}).get("tag") == "at eof":
            await self._ended.wait()
        return await super().call(tool, arguments)


def session(lines: list[bytes]) -> _Out:
    out = _Out()

    async def run() -> None:
        service = Service(SETTINGS, fakes.build(SETTINGS))
        await service.start()
        try:
            wire = _Closing([*OPENING, *lines])
            with anyio.fail_after(30):
                await stdio._session(_UntilEof(service, wire.ended), wire, out)
        finally:
            await service.close()

    anyio.run(run)
    return out


def test_a_decision_running_at_end_of_file_is_finished_and_answered() -> None:
    out = session([call(1, "at eof")])
    [answer] = [m for m in out.messages if m.get("id") == 1]
    assert "error" not in answer, answer
    result = answer["result"]
    assert not result.get("isError"), result
    assert result["structuredContent"]["answers"]["q"]["type"] == "noul"


def test_every_line_before_end_of_file_is_answered_once() -> None:
    """A slow call, a listing, a garbage line, a refused version, a ping and a plain call, all
    written before the end: each answered exactly once (the garbage line with id null)."""
    unsupported = rpc(
        "tools/list",
        4,
        {"_meta": {"io.modelcontextprotocol/protocolVersion": "1999-01-01"}},
    )
    lines = [
        call(1, "at eof"),
        rpc("tools/list", 2, {}),
        b"{not json",
        unsupported,
        rpc("ping", "five"),
        call(6, "plain"),
    ]
    out = session(lines)
    assert out.answered() == Counter(map(repr, [0, 1, 2, None, 4, "five", 6]))
    for message in out.messages:
        assert "Connection closed" not in json.dumps(message), message


def test_a_request_the_client_cancelled_is_owed_nothing() -> None:
    """The spec forbids answering a cancelled request: the session still ends at end of file."""
    lines = [
        call(1, "at eof"),
        call(2, "at eof"),
        rpc("notifications/cancelled", None, {"requestId": 2, "reason": "changed my mind"}),
    ]
    out = session(lines)
    answered = out.answered()
    assert answered[repr(1)] == 1
    assert answered[repr(2)] <= 1  # answered if it finished before the cancel was read
