"""No 500 on any input, over real servers on a longer budget than tests/unit/test_no_500.py:
hostile bodies (every encoding, stacked, truncated, garbled, at and around the limits, any media
type) to the production server's /v1 routes and /mcp, and hostile lines to a real
`decidealot mcp --url` session forwarding to it. Every answer is a 2xx or a 4xx in one of our
envelopes, the stdio session answers every request and lives on, and no log holds a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given

from tests.support import hostile
from tests.support.mcp_clients import StdioServer
from tests.support.servers import ALL_FAKES, RunningServer, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(
        tmp_path_factory.mktemp("no-500"),
        **ALL_FAKES,
        DECIDEALOT_MAX_REQUEST_BYTES=str(hostile.LIMIT),
    )
    yield server
    assert server.stop() == 0
    assert hostile.log_failures(server.log_file.read_text()) == []


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@given(request=hostile.bodies())
@hostile.quick(600)
def test_no_body_gets_a_5xx(http: httpx.Client, request: hostile.Body) -> None:
    response = http.post(request.route, content=request.content(), headers=request.headers)
    found = hostile.problem(request.route, response.status_code, response.headers, response.content)
    assert found is None, (request, found)


@pytest.fixture(scope="module")
def stdio(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioServer]:
    stderr = tmp_path_factory.mktemp("no-500-stdio") / "stderr.log"
    session = StdioServer(["--url", server.url], {}, stderr)
    for line in hostile.OPENING:
        session.write_line(line)
    session.answers(hostile.answers_due(hostile.OPENING))
    yield session
    assert session.process.poll() is None  # no line ended the session
    session.process.stdin.close()  # type: ignore[union-attr]
    assert session.process.wait(20) == 0
    assert hostile.log_failures(session.log()) == []


@given(lines=hostile.stdio_lines())
@hostile.quick(150)
def test_no_stdio_line_ends_the_session(stdio: StdioServer, lines: list[bytes]) -> None:
    for line in lines:
        stdio.write_line(line)
    for answer in stdio.answers(hostile.answers_due(lines)):
        found = hostile.mcp_problem(200, {}, json.dumps(answer).encode())
        assert found is None, (lines, found)
