"""MCP over streamable HTTP, mounted at `/mcp` in the Litestar app next to the REST API.

`McpEndpoint` is the mount plus the SDK's session manager, whose lifetime the app ties to its
own. The gateway in front of the app (bearer auth, request ids, admission) wraps the mount
like any route. Sessions are stateless: every POST is served on its own, so replicas behind a
load balancer need no session affinity (the tools never call back into the client).

POST bodies are read under the REST API's rules before the SDK sees them (read timeout, size
limit on the wire and decoded, gzip and zstd, JSON media type), with the same error envelopes;
the SDK then gets the decoded JSON as a plain body, its tool-call arguments screened by the
REST API's strict JSON parser (`decidealot.mcp.strict`).
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import msgspec
from litestar import asgi
from litestar.types import Message, Receive, Scope, Send
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from decidealot.config import Settings
from decidealot.errors import DecidealotError
from decidealot.mcp.server import ServiceBackend, build_server
from decidealot.mcp.strict import screen
from decidealot.service import Service

MCP_PATH = "/mcp"

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""Host names /mcp accepts when DECIDEALOT_MCP_ALLOWED_HOSTS is unset (any port)."""

_FRAMING_BYTES = 64 * 1024
"""Room for the JSON-RPC envelope around arguments that may be DECIDEALOT_MAX_REQUEST_BYTES."""


def transport_security(allowed_hosts: tuple[str, ...]) -> TransportSecuritySettings:
    """DNS-rebinding protection: the Host (and any browser Origin) must name an allowed host.

    An entry without a port allows any port; `*` turns the check off for deployments that
    are reached under names they cannot list (the bearer key still guards them).
    """
    hosts = allowed_hosts or LOOPBACK_HOSTS
    if "*" in hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    host_patterns: list[str] = []
    origin_patterns: list[str] = []
    for host in hosts:
        variants = [host] if _has_port(host) else [host, f"{host}:*"]
        host_patterns += variants
        origin_patterns += [f"{scheme}://{v}" for scheme in ("http", "https") for v in variants]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=host_patterns,
        allowed_origins=origin_patterns,
    )


def _has_port(host: str) -> bool:
    if host.startswith("["):  # [v6] or [v6]:port
        return "]:" in host
    return ":" in host


def _body_settings(settings: Settings) -> Settings:
    """The settings `read_body` applies to /mcp: the REST API's, with room for the framing."""
    return msgspec.structs.replace(
        settings, max_request_bytes=settings.max_request_bytes + _FRAMING_BYTES
    )


def _session_manager(service: Service) -> StreamableHTTPSessionManager:
    settings = service.settings
    return StreamableHTTPSessionManager(
        app=build_server(ServiceBackend(service)),
        stateless=True,
        security_settings=transport_security(settings.mcp_allowed_hosts),
        max_request_body_size=settings.max_request_bytes + _FRAMING_BYTES,
    )


def _plain(scope: Scope, receive: Receive, body: bytes) -> tuple[Scope, Receive]:
    """The request as the SDK should see it once `body` has been read and decoded: no
    Content-Encoding, the decoded Content-Length, and the body as one message; later
    messages (the client's disconnect) still come from the server."""
    headers = [
        (name, value)
        for name, value in scope["headers"]
        if name not in (b"content-encoding", b"content-length")
    ]
    headers.append((b"content-length", str(len(body)).encode()))
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return {**scope, "headers": headers}, replay


class McpEndpoint:
    """The `/mcp` mount for one service: `route` goes into the app, `running()` around it.

    Wiring, in `decidealot.http.app.create_app`:

        mcp = McpEndpoint(service)
        Litestar(route_handlers=[mcp.route, ...], lifespan=[mcp.running()], ...)

    Litestar enters lifespan managers before `on_startup` and leaves them before
    `on_shutdown`, so MCP sessions stop before the service closes. `running()` can be
    entered once; requests reach the route only while it is.
    """

    def __init__(self, service: Service) -> None:
        # `decidealot.http` imports this module to mount it, so the REST API's body reader
        # and error renderer are imported when the app builds the mount, not at import time.
        from decidealot.http.body import read_body
        from decidealot.http.middleware import send_error

        self._manager = _session_manager(service)
        manager = self._manager
        body_settings = _body_settings(service.settings)

        @asgi(MCP_PATH, is_mount=True, copy_scope=True)
        async def mcp_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
            if scope.get("method") == "POST":
                try:
                    body = await read_body(receive, dict(scope["headers"]), body_settings)
                except DecidealotError as error:  # 400, 408, 413 or 415, as the REST API
                    await send_error(send, error, [])
                    return
                screened = await asyncio.to_thread(screen, body)  # a parse: off the loop
                scope, receive = _plain(scope, receive, screened)
            await manager.handle_request(scope, receive, send)  # type: ignore[arg-type]

        self.route = mcp_endpoint

    def running(self) -> AbstractAsyncContextManager[None]:
        """The session manager's lifetime: its task group serves every MCP request."""
        return self._manager.run()
