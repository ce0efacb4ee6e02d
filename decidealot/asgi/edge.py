"""What sits in front of `AuthAdmission` (decidealot.asgi.middleware) for callers that reach the
service through others: a reverse proxy that serves it under a path prefix (`RootPath`,
DECIDEALOT_ROOT_PATH) and browsers calling from other origins (`Cors`,
DECIDEALOT_CORS_ORIGINS).

Both wrap it rather than sit inside the Litestar app: the prefix must be gone before it
decides what is public and which route a metric counts, and CORS headers must reach its own
answers too (a 401, a drain's 503), or a browser could not read why it was refused. A
preflight carries no credentials, so it is answered here, before auth.
"""

from __future__ import annotations

from litestar.config.cors import CORSConfig
from litestar.constants import DEFAULT_ALLOWED_CORS_HEADERS
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from decidealot.contract import TRUNCATED_HEADER

ALLOWED_METHODS = ("GET", "POST")
ALLOWED_HEADERS = (
    "authorization",
    "content-type",
    "content-encoding",
    "x-request-id",
    "traceparent",
    "tracestate",
    "mcp-protocol-version",
    "mcp-session-id",
    "last-event-id",
)
"""What a browser may send: the key, the body's encodings, a request id, a trace context and
the MCP transport's headers."""
EXPOSED_HEADERS = (
    "x-request-id",
    "x-typesafe-request-id",
    "retry-after",
    "www-authenticate",
    TRUNCATED_HEADER.lower(),
)
"""What a browser's script may read of an answer besides the CORS-safelisted headers."""


class RootPath:
    """Serves the app under `prefix` as well as at `/`: a proxy that keeps the prefix
    (`/decide/v1/models`) and one that strips it (`/v1/models`) reach the same routes. The
    prefix is cut from `path` and `raw_path`; `root_path` is left alone, since Litestar's
    router would cut it again wherever it recurs in a path."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self._app = app
        self._prefix = prefix
        self._raw = prefix.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path == self._prefix or path.startswith(self._prefix + "/"):
                raw: bytes = scope.get("raw_path") or path.encode()
                if raw.startswith(self._raw):
                    raw = raw[len(self._raw) :] or b"/"
                scope = {**scope, "path": path[len(self._prefix) :] or "/", "raw_path": raw}  # type: ignore[typeddict-item]
        await self._app(scope, receive, send)


class Cors:
    """CORS for the listed origins only (Litestar's `CORSConfig` holds the rules): their
    preflights get 204 with what they may send, their requests' answers the headers that let
    the page read them. Requests from any other origin, and preflights asking for a method or
    header not allowed, pass on as if CORS were off, so the browser refuses them."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self._app = app
        self.config = CORSConfig(
            allow_origins=list(origins),
            allow_methods=list(ALLOWED_METHODS),
            allow_headers=list(ALLOWED_HEADERS),
            expose_headers=list(EXPOSED_HEADERS),
        )
        # and the CORS-safelisted request headers every preflight may name
        self._allowed_headers = {
            h.lower() for h in (*ALLOWED_HEADERS, *DEFAULT_ALLOWED_CORS_HEADERS)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not origin or not self.config.is_origin_allowed(origin):
            await self._app(scope, receive, send)
            return
        requested = headers.get(b"access-control-request-method")
        if scope["method"] == "OPTIONS" and requested is not None:
            if self._preflight_allowed(requested, headers.get(b"access-control-request-headers")):
                await self._answer_preflight(origin, send)
                return
            await self._app(scope, receive, send)
            return
        await self._app(scope, receive, self._with_headers(send, origin))

    def _preflight_allowed(self, method: bytes, asked: bytes | None) -> bool:
        names = {h.strip().lower() for h in (asked or b"").decode("latin-1").split(",")}
        return method.decode("latin-1") in ALLOWED_METHODS and names - {""} <= self._allowed_headers

    def _origin_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        allowed = "*" if self.config.is_allow_all_origins else origin
        return [(b"access-control-allow-origin", allowed.encode()), (b"vary", b"Origin")]

    async def _answer_preflight(self, origin: str, send: Send) -> None:
        headers = [
            (name.lower().encode(), value.encode())
            for name, value in self.config.preflight_headers.items()
            if name.lower() not in ("access-control-allow-origin", "vary")
        ]
        headers += self._origin_headers(origin)
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def _with_headers(self, send: Send, origin: str) -> Send:
        exposed = (b"access-control-expose-headers", ", ".join(EXPOSED_HEADERS).encode())
        extra = [*self._origin_headers(origin), exposed]

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return send_with_cors
