"""What sits in front of `Gateway` (decidealot.asgi.middleware): the path prefix a reverse proxy
serves the service under (`RootPath`, DECIDEALOT_ROOT_PATH) and CORS for pages on other origins
(`Cors`, DECIDEALOT_CORS_ORIGINS). In front, not inside the app: the prefix must be gone before
the gateway decides what is public and which route a metric counts, CORS headers must reach its
own answers too (a 401, a drain's 503), and a preflight, which carries no credentials, must be
answered before auth.
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
    """CORS for the listed origins (the rules in Litestar's `CORSConfig`): their preflights get
    204, their answers the headers that let the page read them. Any other origin, and a
    preflight asking for a method or header not allowed, passes on as if CORS were off (a 401
    without the key), so the browser refuses it; Litestar's own CORS middleware would answer
    such a preflight 400, and from inside the app, behind auth."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self._app = app
        self.config = CORSConfig(
            allow_origins=list(origins),
            allow_methods=list(ALLOWED_METHODS),
            allow_headers=list(ALLOWED_HEADERS),
            expose_headers=list(EXPOSED_HEADERS),
        )
        # and the CORS-safelisted request headers every preflight may name
        self._allowed_headers = {h.lower() for h in DEFAULT_ALLOWED_CORS_HEADERS}
        self._allowed_headers.update(self.config.allow_headers)
        self._preflight = [
            (name.lower().encode(), value.encode())
            for name, value in self.config.preflight_headers.items()
            if name.lower() not in ("access-control-allow-origin", "vary")
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"]) if scope["type"] == "http" else {}
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not origin or not self.config.is_origin_allowed(origin):
            await self._app(scope, receive, send)
        elif scope["method"] != "OPTIONS" or b"access-control-request-method" not in headers:
            await self._app(scope, receive, self._with_headers(send, origin))
        elif self._preflight_allowed(headers):
            answer = [*self._preflight, *self._origin_headers(origin)]
            await send({"type": "http.response.start", "status": 204, "headers": answer})
            await send({"type": "http.response.body", "body": b""})
        else:
            await self._app(scope, receive, send)

    def _preflight_allowed(self, headers: dict[bytes, bytes]) -> bool:
        method = headers[b"access-control-request-method"].decode("latin-1")
        asked = headers.get(b"access-control-request-headers", b"").decode("latin-1")
        names = {h.strip().lower() for h in asked.split(",")} - {""}
        return method in ALLOWED_METHODS and names <= self._allowed_headers

    def _origin_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        allowed = "*" if self.config.is_allow_all_origins else origin
        return [(b"access-control-allow-origin", allowed.encode()), (b"vary", b"Origin")]

    def _with_headers(self, send: Send, origin: str) -> Send:
        exposed = (b"access-control-expose-headers", ", ".join(EXPOSED_HEADERS).encode())
        extra = [*self._origin_headers(origin), exposed]

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return send_with_cors
