"""MCP over streamable HTTP, mounted at `/mcp` in the Litestar app next to the REST API.

`McpEndpoint` is the mount plus the SDK's session manager, whose lifetime the app ties to its
own. The gateway in front of the app (bearer auth, request ids, admission) wraps the mount
like any route. Sessions are stateless: every POST is served on its own, so replicas behind a
load balancer need no session affinity (the tools never call back into the client).

POST bodies are read under the REST API's rules before the SDK sees them (read timeout, size
limit on the wire and decoded, gzip and zstd, JSON media type, here required), with the same
error envelopes; the SDK then gets the decoded JSON as a plain body, its tool-call arguments
screened by the REST API's strict JSON parser (`decidealot.mcp.strict`). Other methods get
the same envelope in a 405 that names POST in `Allow`.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import msgspec
from litestar import asgi
from litestar.types import Message, Receive, Scope, Send
from mcp.server.streamable_http import jsonrpc_message_adapter
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from decidealot.asgi.body import read_body
from decidealot.asgi.middleware import send_error
from decidealot.config import Settings
from decidealot.errors import DecidealotError, MalformedBody, UnsupportedMediaType
from decidealot.mcp.server import ServiceBackend, build_server
from decidealot.mcp.strict import screen
from decidealot.service import Service

MCP_PATH = "/mcp"

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""Host names /mcp accepts when DECIDEALOT_MCP_ALLOWED_HOSTS is unset (any port)."""

_FRAMING_BYTES = 64 * 1024
"""Room for the JSON-RPC envelope around arguments that may be DECIDEALOT_MAX_REQUEST_BYTES."""


class MethodNotAllowed(DecidealotError):
    """Anything but POST: sessions are stateless, so there is no event stream to GET (the MCP
    spec allows a 405 for it) and no session to DELETE."""

    status, code, message = 405, "METHOD_NOT_ALLOWED", "Method Not Allowed"


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
    Content-Encoding, the decoded Content-Length, plain `application/json`, and the body as
    one message; later messages (the client's disconnect) still come from the server."""
    headers = [
        (name, value)
        for name, value in scope["headers"]
        if name not in (b"content-encoding", b"content-length", b"content-type")
    ]
    headers += [
        (b"content-length", str(len(body)).encode()),
        (b"content-type", b"application/json"),  # checked: JSON, perhaps as application/*+json
    ]
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return {**scope, "headers": headers}, replay


def _screened(body: bytes) -> bytes:
    """The body with its tool-call arguments screened (`decidealot.mcp.strict`), if it is one
    JSON-RPC message exactly as the SDK's schema (in the OpenAPI document) states it: the
    SDK's own parse is lax (`"code": true` passes as an integer) and answers plain JSON-RPC
    errors, so a body the document calls invalid gets our 400 envelope first."""
    screened = screen(body)
    try:
        jsonrpc_message_adapter.validate_json(screened, strict=True)
    except ValueError:  # pydantic's ValidationError, and invalid JSON
        raise MalformedBody("the body is not one JSON-RPC 2.0 message") from None
    return screened


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
        self._manager = _session_manager(service)
        manager = self._manager
        body_settings = _body_settings(service.settings)

        @asgi(MCP_PATH, is_mount=True, copy_scope=True)
        async def mcp_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
            if scope.get("method") != "POST":
                await send_error(send, MethodNotAllowed(), [(b"allow", b"POST")])
                return
            headers = dict(scope["headers"])
            try:
                if b"content-type" not in headers:
                    raise UnsupportedMediaType("send the JSON-RPC message as application/json")
                body = await read_body(receive, headers, body_settings)
                screened = await asyncio.to_thread(_screened, body)  # parses: off the loop
            except DecidealotError as error:  # 400, 408, 413 or 415, as the REST API
                await send_error(send, error, [])
                return
            scope, receive = _plain(scope, receive, screened)
            await manager.handle_request(scope, receive, send)  # type: ignore[arg-type]

        self.route = mcp_endpoint

    def running(self) -> AbstractAsyncContextManager[None]:
        """The session manager's lifetime: its task group serves every MCP request."""
        return self._manager.run()
