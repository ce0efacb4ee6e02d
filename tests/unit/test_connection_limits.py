"""The connection settings as granian gets them, the open-file limit raised to fit them, and the
open connections counted from the kernel's tables. Over a real server, with raw sockets:
tests/e2e/test_connections.py."""

from __future__ import annotations

import socket
import textwrap

import pytest
from granian.constants import HTTPModes

from decidealot import registry
from decidealot.http.connections import open_connections
from decidealot.http.server import FILES_BESIDE_CONNECTIONS, server_options
from tests.support.cli import run_cli
from tests.unit.test_strict_settings import refusal


def test_granian_holds_the_connections_and_times_out_their_heads() -> None:
    settings = registry.from_env(
        {"DECIDEALOT_MAX_CONNECTIONS": "10000", "DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS": "2.5"}
    )
    options = server_options(settings)
    assert options["backpressure"] == options["backlog"] == 10000
    assert options["http1_settings"].header_read_timeout == 2500  # type: ignore[attr-defined]
    # HTTP/1.1 only: granian's sniffing for HTTP/2 waits for a first byte with no timeout
    assert options["http"] == HTTPModes.http1
    defaults = server_options(registry.from_env({}))
    assert defaults["backpressure"] == 4096
    assert defaults["http1_settings"].header_read_timeout == 5000  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"DECIDEALOT_MAX_CONNECTIONS": "8"},
            "DECIDEALOT_MAX_CONNECTIONS: expected an integer from 16 to 1000000, got 8",
        ),
        (
            {"DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS": "0"},
            "DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS: expected a finite number of seconds greater "
            "than 0, got '0'",
        ),
        (
            {"DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS": "0.01"},
            "DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS: expected seconds from 0.1 to 3600, got '0.01'",
        ),
        (
            {"DECIDEALOT_PROBE_PORT": "70000"},
            "DECIDEALOT_PROBE_PORT: expected an integer from 0 to 65535, got 70000",
        ),
        (
            {"DECIDEALOT_PORT": "9000", "DECIDEALOT_PROBE_PORT": "9000"},
            "DECIDEALOT_PROBE_PORT: expected a port other than the API's (9000), or 0 for none",
        ),
    ],
)
def test_bad_connection_settings_are_refused_naming_them(env: dict[str, str], line: str) -> None:
    assert refusal(env) == line


@pytest.mark.slow  # a real command
def test_serve_refuses_a_probe_port_that_is_its_port() -> None:
    result = run_cli("serve", "--port", "9000", DECIDEALOT_PROBE_PORT="9000")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "decidealot: DECIDEALOT_PROBE_PORT: expected a port other than the API's (9000), or 0 "
        "for none"
    ]


def _limit_after(soft: int, hard: int, connections: int) -> tuple[int, int, str]:
    """The open-file limits a fresh process has after `open_file_limit(connections)`, started
    with `soft`/`hard`, and what it logged."""
    script = textwrap.dedent(
        f"""
        import logging, resource, sys
        logging.basicConfig(stream=sys.stdout, format="%(message)s")
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
        from decidealot.http.server import open_file_limit
        open_file_limit({connections})
        print(*resource.getrlimit(resource.RLIMIT_NOFILE))
        """
    )
    run = run_cli(code=script, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    *logged, limits = run.stdout.strip().splitlines()
    now_soft, now_hard = map(int, limits.split())
    return now_soft, now_hard, "\n".join(logged)


def test_the_open_file_limit_is_raised_to_fit_the_connections() -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    needed = 4096 + FILES_BESIDE_CONNECTIONS
    if hard != resource.RLIM_INFINITY and hard < needed + 1:
        pytest.skip(f"the hard open-file limit ({hard}) is below {needed + 1}")
    soft, hard, logged = _limit_after(256, needed + 1, 4096)
    assert needed <= soft <= hard == needed + 1  # (importing granian raises it to the hard one)
    assert logged == ""


def test_a_hard_limit_too_low_is_said_at_startup() -> None:
    soft, hard, logged = _limit_after(256, 2048, 4096)
    assert (soft, hard) == (2048, 2048)
    assert "the open-file limit is 2048 (hard limit 2048)" in logged
    assert "about 1024 connections can be held, not DECIDEALOT_MAX_CONNECTIONS=4096" in logged


def test_open_connections_are_the_accepted_sockets_on_the_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert open_connections(port) == 0  # the listening socket is no connection
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        try:
            assert open_connections(port) == 3  # the clients' ends are on other ports
            accepted.pop().close()
            assert open_connections(port) == 2
        finally:
            for sock in clients + accepted:
                sock.close()
