"""Runs the app on granian, embedded (one worker, in this process), and owns SIGTERM: so
providers, residency and the checked settings stay in one process, and shutdown is ordered: stop
admitting (new requests and /health get 503), let admitted requests finish for up to
DECIDEALOT_DRAIN_SECONDS and answer the rest 503, stop the server, then the provider workers.

Connections (docs/api.md#connections): granian holds up to DECIDEALOT_MAX_CONNECTIONS (its
default stops accepting at its 128-connection backlog), speaks HTTP/1.1 only so that its header
read timeout also covers a connection that never sends a byte (its protocol sniffing for HTTP/2
waits for one with no limit), and the open-file soft limit is raised to fit them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
from typing import NoReturn

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server

from decidealot import tracing
from decidealot.config import Settings
from decidealot.http.app import create_app
from decidealot.service import Service

log = logging.getLogger("decidealot.server")


async def serve(service: Service) -> int:
    """Serve until SIGTERM or SIGINT; the exit status (0 after a clean shutdown)."""
    settings = service.settings
    tracing.setup(settings)
    open_file_limit(settings.max_connections)
    server = Server(create_app(service), **server_options(settings))
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    async def shut_down() -> None:
        log.info(
            "shutting down: draining in-flight requests for up to %g s", settings.drain_seconds
        )
        await service.ledger.drain(settings.drain_seconds)
        server.stop()

    def on_signal() -> None:
        if not stopping:
            stopping.append(loop.create_task(shut_down()))

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    log.info(
        "starting on http://%s:%d (up to %d connections, %g s to send a request's head)",
        settings.host,
        settings.port,
        settings.max_connections,
        settings.header_read_timeout_seconds,
    )
    try:
        await server.serve()
    except (OSError, RuntimeError) as exc:  # granian reports bind failures as RuntimeError
        print(
            f"decidealot: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr
        )
        return 1
    if server.interrupt_children:  # the worker died, e.g. startup failed
        log.error("the server stopped unexpectedly")
        return 1
    return 0


FILES_BESIDE_CONNECTIONS = 1024
"""Open files the process needs besides its connections: the listening sockets, each model
worker's pipes, checkpoint files, logs and the interpreter's own (a few dozen in practice)."""


def server_options(settings: Settings) -> dict[str, object]:
    """granian's `Server` arguments: the listening address and the connection limits."""
    return {
        "address": settings.host,
        "port": settings.port,
        "interface": Interfaces.ASGI,
        "http": HTTPModes.http1,
        "websockets": False,
        "log_enabled": False,
        # the kernel's accept queue (capped by net.core.somaxconn), and the connections held
        "backlog": settings.max_connections,
        "backpressure": settings.max_connections,
        "http1_settings": HTTP1Settings(
            header_read_timeout=round(settings.header_read_timeout_seconds * 1000),
            keep_alive=True,
        ),
    }


def open_file_limit(connections: int) -> int:
    """Raise the open-file soft limit to fit `connections` besides the process's other files,
    up to the hard limit, and say so when that is not enough; the soft limit now."""
    needed = connections + FILES_BESIDE_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        log.warning(
            "the open-file limit is %d (hard limit %d): about %d connections can be held, not "
            "DECIDEALOT_MAX_CONNECTIONS=%d; raise the hard limit (ulimit -Hn, the container's "
            "nofile) to %d",
            target,
            hard,
            max(0, target - FILES_BESIDE_CONNECTIONS),
            connections,
            needed,
        )
    return target


def run(service: Service) -> NoReturn:
    """Serve, then leave the process at once: granian's native threads may still be winding
    down, and letting the interpreter finalise under them can abort the process."""
    code = asyncio.run(serve(service))
    tracing.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
