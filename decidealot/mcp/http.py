"""MCP over streamable HTTP at `/mcp`, behind the REST API's gateway, and stateless: every POST
stands alone, so replicas need no session affinity (the tools never call back into the client).
A body is read under the REST API's rules (`read_body`), `checked` and its version routing
settled before the SDK gets plain JSON.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import msgspec
from litestar import asgi
from litestar.types import Message, Receive, Scope, Send
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
)
from mcp_types import UNSUPPORTED_PROTOCOL_VERSION, JSONRPCMessage, JSONRPCRequest
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from decidealot.asgi.body import read_body
from decidealot.asgi.middleware import send_error, send_json
from decidealot.errors import DecidealotError, UnsupportedMediaType
from decidealot.ledger import ADMITTED
from decidealot.mcp.server import ServiceBackend, build_server
from decidealot.mcp.strict import (
    SERVED_VERSIONS,
    JsonRpcRefusal,
    checked,
    modern_version,
    unsupported_version,
)
from decidealot.service import Service

MCP_PATH = "/mcp"

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")  # DECIDEALOT_MCP_ALLOWED_HOSTS unset

_FRAMING_BYTES = 64 * 1024  # room for the JSON-RPC envelope around arguments of the body limit
_SCREENED_GROWTH = 4
"""How many times its size a body can grow once screened: refused arguments become their 422
envelope, quoting what was refused JSON-escaped (an astral character's 4 UTF-8 bytes become 12).
The SDK's own body limit is past that: a body `read_body` admitted never gets its plain 413."""


class MethodNotAllowed(DecidealotError):
    """Anything but POST: sessions are stateless, so there is no event stream to GET (the MCP
    spec allows a 405 for it) and no session to DELETE."""

    status, code, message = 405, "METHOD_NOT_ALLOWED", "Method Not Allowed"


def transport_security(
    allowed_hosts: tuple[str, ...], cors_origins: tuple[str, ...] = ()
) -> TransportSecuritySettings:
    """DNS-rebinding protection: the Host (and any browser Origin) must name an allowed host (one
    without a port: on any port), or the Origin be a listed CORS one. `*` turns the check off for
    deployments reached under names they cannot list (the bearer key still guards them). A CORS
    `*` is not carried over: any page may read the API's answers, not reach the tools."""
    hosts = allowed_hosts or LOOPBACK_HOSTS
    if "*" in hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    host_patterns: list[str] = []
    origin_patterns: list[str] = []
    for host in hosts:
        has_port = "]:" in host if host.startswith("[") else ":" in host  # [v6] or [v6]:port
        variants = [host] if has_port else [host, f"{host}:*"]
        host_patterns += variants
        origin_patterns += [f"{scheme}://{v}" for scheme in ("http", "https") for v in variants]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=host_patterns,
        allowed_origins=origin_patterns + [o for o in cors_origins if o != "*"],
    )


def _plain(scope: Scope, receive: Receive, body: bytes) -> tuple[Scope, Receive]:
    """The request as the SDK should see it once `body` is read and decoded: plain JSON headers,
    the body as one message; later ones (the client's disconnect) still come from the server."""
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


def _misrouted(message: JSONRPCMessage, headers: dict[bytes, bytes]) -> JsonRpcRefusal | None:
    """The SDK routes a POST by its MCP-Protocol-Version header alone (a 2025 version, or none,
    to the handshake era). So a 2026-07-28 request (its `_meta` names a version) under a 2025
    header or none gets the 2026 ladder's verdict (-32020), not legacy service; and a header
    naming no version served gets -32022, not a complaint about a missing `_meta` (docs/mcp.md)."""
    raw = headers.get(MCP_PROTOCOL_VERSION_HEADER.encode())
    header = raw.decode("latin-1") if raw is not None else None
    request_id = message.id if isinstance(message, JSONRPCRequest) else None
    version = modern_version(message)
    if version is not None:
        if header in MODERN_PROTOCOL_VERSIONS:
            return None  # the SDK's 2026 entry checks the rest
        verdict = classify_inbound_request(
            message.model_dump(by_alias=True, mode="json"),
            headers={
                name.decode("latin-1"): value.decode("latin-1") for name, value in headers.items()
            },
        )
        if not isinstance(verdict, InboundLadderRejection):
            return None
        if verdict.code == UNSUPPORTED_PROTOCOL_VERSION:
            return unsupported_version(str(version), request_id)
        return JsonRpcRefusal(verdict.code, verdict.message, verdict.data, request_id)
    if header is not None and header not in SERVED_VERSIONS:
        return unsupported_version(header, request_id)
    return None


class McpEndpoint:
    """The `/mcp` mount for one service: `route` goes into the app's handlers, `running()` into
    its lifespan, which Litestar leaves before `on_shutdown`, so MCP sessions stop before the
    service closes. `running()` can be entered once; requests reach the route only while it is."""

    def __init__(self, service: Service) -> None:
        settings = service.settings
        self.body_limit = settings.max_request_bytes + _FRAMING_BYTES
        body_settings = msgspec.structs.replace(settings, max_request_bytes=self.body_limit)
        manager = self._manager = StreamableHTTPSessionManager(
            app=build_server(ServiceBackend(service, admits=False)),  # the gateway admits /mcp
            stateless=True,
            security_settings=transport_security(settings.mcp_allowed_hosts, settings.cors_origins),
            max_request_body_size=_SCREENED_GROWTH * self.body_limit + _FRAMING_BYTES,
        )

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
                screened, message = await asyncio.to_thread(checked, body)  # off the loop
                if (misrouted := _misrouted(message, headers)) is not None:
                    raise misrouted
            except DecidealotError as error:  # 400, 408, 413 or 415, as the REST API
                await send_error(send, error, [])  # the gateway drops what is left of the body
                return
            except JsonRpcRefusal as refusal:
                answer = refusal.answer
                body = answer.model_dump_json(by_alias=True, exclude_unset=True).encode()
                await send_json(send, ERROR_CODE_HTTP_STATUS.get(answer.error.code, 400), body)
                return
            scope, receive = _plain(scope, receive, screened)
            token = ADMITTED.set(asyncio.current_task())  # the gateway admitted this task
            try:
                await manager.handle_request(scope, receive, send)  # type: ignore[arg-type]
            finally:
                ADMITTED.reset(token)

        self.route = mcp_endpoint

    def running(self) -> AbstractAsyncContextManager[None]:
        return self._manager.run()
