"""Runs the app on granian, embedded (one worker, in this process), and owns SIGTERM: so
providers, residency and the checked settings stay in one process, and shutdown is ordered: stop
admitting (new requests and /health get 503), let admitted requests finish for up to
DECIDEALOT_DRAIN_SECONDS and answer the rest 503, stop the server, then the provider workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import NoReturn

from granian.constants import Interfaces
from granian.server.embed import Server

from decidealot import tracing
from decidealot.http.app import create_app
from decidealot.service import Service

log = logging.getLogger("decidealot.server")


async def serve(service: Service) -> int:
    """Serve until SIGTERM or SIGINT; the exit status (0 after a clean shutdown)."""
    settings = service.settings
    tracing.setup(settings)
    server = Server(
        create_app(service),
        address=settings.host,
        port=settings.port,
        interface=Interfaces.ASGI,
        websockets=False,
        log_enabled=False,
    )
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
    log.info("starting on http://%s:%d", settings.host, settings.port)
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


def run(service: Service) -> NoReturn:
    """Serve, then leave the process at once: granian's native threads may still be winding
    down, and letting the interpreter finalise under them can abort the process."""
    code = asyncio.run(serve(service))
    tracing.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
