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
from collections.abc import Callable
from typing import NoReturn

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from decidealot import tracing
from decidealot.asgi.middleware import ProbesOnly
from decidealot.config import Settings
from decidealot.http.app import create_app
from decidealot.service import Service

log = logging.getLogger("decidealot.server")


async def serve(service: Service) -> int:
    """Serve until SIGTERM or SIGINT; the exit status (0 after a clean shutdown)."""
    settings = service.settings
    tracing.setup(settings)
    open_file_limit(settings.max_connections)
    app = create_app(service)
    loop = asyncio.get_running_loop()
    probes = Probes(app, settings, on_failure=lambda: on_signal())
    server = Server(OnStarted(app, probes.start), **server_options(settings))
    stopping: list[asyncio.Task[None]] = []

    async def shut_down() -> None:
        log.info(
            "shutting down: draining in-flight requests for up to %g s", settings.drain_seconds
        )
        await service.ledger.drain(settings.drain_seconds)
        server.stop()
        probes.stop()

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
        where = f"{settings.host}:{settings.port}"
        print(f"decidealot: cannot listen on {where}: {one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        probes.stop()
    if not await probes.stopped():
        return 1
    if server.interrupt_children:  # the worker died, e.g. startup failed
        log.error("the server stopped unexpectedly")
        return 1
    return 0


def one_line(exc: BaseException) -> str:
    """granian's error, less the native backtrace it appends where RUST_BACKTRACE is set."""
    return next(iter(str(exc).splitlines()), type(exc).__name__)


class OnStarted:
    """The app, calling `then` once its lifespan startup has completed (the service started)."""

    def __init__(self, app: ASGIApp, then: Callable[[], None]) -> None:
        self._app, self._then = app, then

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self._app(scope, receive, send)
            return

        async def send_and_tell(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                self._then()

        await self._app(scope, receive, send_and_tell)


class Probes:
    """DECIDEALOT_PROBE_PORT: /health and /metrics on a port of their own, so that a flood of
    the API port never fails a probe or a scrape. It opens once the service has started, as the
    API port does, and closes with it; a port it cannot bind stops the service."""

    def __init__(self, app: ASGIApp, settings: Settings, on_failure: Callable[[], None]) -> None:
        self._settings, self._on_failure = settings, on_failure
        self._server: Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed = False
        if settings.probe_port:
            root = settings.root_path
            paths = [path for probe in PROBE_PATHS for path in (probe, root + probe)]
            options = server_options(settings) | {
                "port": settings.probe_port,
                "interface": Interfaces.ASGINL,  # the API server runs the app's lifespan
                "backlog": PROBE_CONNECTIONS,
                "backpressure": PROBE_CONNECTIONS,
            }
            self._server = Server(ProbesOnly(app, paths), **options)

    def start(self) -> None:
        if self._server is not None and self._task is None:
            log.info("probes on http://%s:%d", self._settings.host, self._settings.probe_port)
            self._task = asyncio.get_running_loop().create_task(self._serve(self._server))

    async def _serve(self, server: Server) -> None:
        try:
            await server.serve()
        except (OSError, RuntimeError) as exc:
            where = f"{self._settings.host}:{self._settings.probe_port}"
            print(
                f"decidealot: cannot listen on {where} (DECIDEALOT_PROBE_PORT): {one_line(exc)}",
                file=sys.stderr,
            )
            self._failed = True
            self._on_failure()  # the API server stops too

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    async def stopped(self) -> bool:
        """Once the probe server has stopped: False when it failed."""
        if self._task is not None:
            await self._task
        return not self._failed


PROBE_PATHS = ("/health", "/metrics")
PROBE_CONNECTIONS = 128
"""Probes and scrapes open a connection or two each: the probe port needs few."""

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
