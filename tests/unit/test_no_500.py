"""No 500 on any input, in process: hostile bodies through the whole body path of the app (the
gateway layer, /v1 routes, /mcp) and hostile lines through `decidealot mcp`'s stdio session,
drawn by hypothesis (tests/support/hostile.py) on a short fixed budget. Every answer is a 2xx or
a 4xx in one of our envelopes and nothing is logged as a failure. tests/e2e/test_no_500.py runs
the same strategies over real servers on a longer budget.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from hypothesis import event, given

from decidealot import registry
from decidealot.mcp import stdio
from decidealot.mcp.server import ServiceBackend
from decidealot.service import Service
from tests.support import fakes, hostile
from tests.support.app import InProcessApp, app_fixture
from tests.support.servers import ALL_FAKES

ENV = {**ALL_FAKES, "DECIDEALOT_MAX_REQUEST_BYTES": str(hostile.LIMIT)}
SETTINGS = registry.from_env(ENV)
app = app_fixture("app", **ENV, DECIDEALOT_MCP_ALLOWED_HOSTS="testserver.local")


@pytest.fixture(scope="module")
def records() -> Iterator[hostile.Records]:
    handler = hostile.Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


@given(request=hostile.bodies())
@hostile.quick(200)
def test_no_body_gets_a_5xx(
    app: InProcessApp, records: hostile.Records, request: hostile.Body
) -> None:
    records.records.clear()
    response = app.client.post(request.route, content=request.content(), headers=request.headers)
    found = hostile.problem(request.route, response.status_code, response.headers, response.content)
    event(f"{request.route} {response.status_code}")
    assert found is None, (request, found)
    assert records.failures() == [], request


@pytest.mark.parametrize("name", list(hostile.FOUND))
def test_bodies_once_found_get_our_envelope(
    app: InProcessApp, records: hostile.Records, name: str
) -> None:
    request = hostile.FOUND[name]
    records.records.clear()
    response = app.client.post(request.route, content=request.content(), headers=request.headers)
    found = hostile.problem(request.route, response.status_code, response.headers, response.content)
    assert found is None, found
    assert records.failures() == []


class _Out:
    """The session's stdout: the JSON-RPC lines it writes."""

    def __init__(self) -> None:
        self.written: list[str] = []

    async def write(self, text: str) -> None:
        self.written.extend(line for line in text.split("\n") if line)

    async def flush(self) -> None:
        pass

    def answered(self) -> list[object]:
        return [json.loads(line).get("id") for line in self.written]


class _Wire:
    """A client's end of the stdio pipe: it writes its lines, waits for an answer to every
    request among them, then closes (end of file)."""

    def __init__(self, lines: list[bytes], out: _Out) -> None:
        self._lines = lines
        self._out = out

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for line in self._lines:
            yield line + b"\n"
        expected = Counter(map(repr, hostile.answers_due(self._lines)))
        with anyio.fail_after(10):
            while not expected <= Counter(map(repr, self._out.answered())):
                await anyio.sleep(0.005)


@given(lines=hostile.stdio_lines())
@hostile.quick(40)
def test_no_stdio_line_ends_the_session(records: hostile.Records, lines: list[bytes]) -> None:
    """Each session answers every request among its lines and ends normally at end of file;
    what it writes is JSON-RPC, tool errors in our envelope."""
    records.records.clear()
    out = _Out()

    async def session() -> None:
        service = Service(SETTINGS, fakes.build(SETTINGS))
        await service.start()
        try:
            wire = _Wire([*hostile.OPENING, *lines], out)
            await stdio._session(ServiceBackend(service), wire, out)
        finally:
            await service.close()

    anyio.run(session)
    event(f"{len(hostile.answers_due(lines))} requests")
    for line in out.written:
        found = hostile.mcp_problem(200, {}, line.encode())
        assert found is None, (lines, found)
        assert "Connection closed" not in line, lines
    assert records.failures() == [], lines
