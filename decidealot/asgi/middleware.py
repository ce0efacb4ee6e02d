"""The ASGI layers in front of every route (404s and /mcp included). `Gateway` gives each request
its id, access line, HTTP metrics and trace span, checks its bearer token and admits it unless
the service is draining; a request the drain cuts is answered 503 here, never cut off. Whatever
answered before the body had all arrived, the rest is then read and dropped (`Incoming.discard`).

In front of it, when set: a reverse proxy's path prefix (`RootPath`) and CORS (`Cors`). The
prefix must be gone before the gateway decides what is public and which route a metric counts,
CORS headers must reach its own answers too (a 401, a drain's 503), and a preflight, which
carries no credentials, must be answered before auth.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
import uuid
from collections.abc import Collection, Sequence

import msgspec
from litestar.config.cors import CORSConfig
from litestar.constants import DEFAULT_ALLOWED_CORS_HEADERS
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from decidealot import logs, metrics, tracing
from decidealot.asgi.body import Incoming
from decidealot.contract import TRUNCATED_HEADER, ErrorBody
from decidealot.errors import DecidealotError, ShuttingDown, Unauthorized
from decidealot.ledger import CUT_SHORT
from decidealot.service import Service

log = logging.getLogger("decidealot.http")

PUBLIC_PATHS = frozenset({"/health", "/docs", "/docs/", "/openapi.json"})
PUBLIC_PREFIXES = ("/docs/assets/", "/.well-known/")
"""Swagger's page, assets and document hold no secret, and a browser cannot send a bearer token
to open them. OAuth clients probe the well-known paths after a 401: a 404 without a key tells
them there is no OAuth here; a 401 sends them through discovery to a dead end (docs/mcp.md)."""
UNADMITTED_PATHS = frozenset({"/metrics"})  # answered while draining: a scrape watches it
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_REQUEST_ID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}"
)


def request_id_from(value: bytes | None) -> str:
    if value is not None:
        text = value.decode("latin-1").strip()
        if _REQUEST_ID.fullmatch(text):
            return text
    return str(uuid.uuid4())


async def send_json(
    send: Send, status: int, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    length = str(len(body)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", length), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: DecidealotError, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
    await send_json(send, error.status, msgspec.json.encode(error.envelope()), headers + extra)


class BearerKeys:
    """DECIDEALOT_API_KEY's keys: which one a request's bearer token is, or the challenge."""

    def __init__(self, keys: Collection[str]) -> None:
        # a key's id in the access line: the first 8 hex digits of its SHA-256, which say which
        # key a client used without saying anything of a random key (`printf %s "$KEY" | sha256sum`)
        self._keys = {key.encode(): hashlib.sha256(key.encode()).hexdigest()[:8] for key in keys}

    def match(self, headers: dict[bytes, bytes]) -> str:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        token = token.strip()
        matched = ""
        for key, ident in self._keys.items():  # every key, so the time does not tell which
            if hmac.compare_digest(token, key):
                matched = f" key {ident}"
        return matched if scheme.lower() == b"bearer" else ""

    def challenge(self, headers: dict[bytes, bytes]) -> bytes:
        """RFC 6750's: bare without credentials, `invalid_token` for a wrong one (or for
        credentials in another scheme), so a client can tell a missing key from a wrong one."""
        if b"authorization" not in headers:
            return b"Bearer"
        return b'Bearer error="invalid_token", error_description="the bearer token is not valid"'


class Gateway:
    def __init__(
        self,
        app: ASGIApp,
        service: Service,
        routes: Collection[str] = (),
        mounts: Collection[str] = (),
        largest_body: int | None = None,
    ) -> None:
        """`routes` and `mounts` (path prefixes) are the metrics' `route` label values;
        `largest_body` (/mcp's, with its JSON-RPC framing) bounds what an early answer drops."""
        self._app = app
        self._service = service
        keys = service.settings.api_key
        self._keys = None if keys is None else BearerKeys(keys)
        self._largest_body = largest_body or service.settings.max_request_bytes
        self._routes = frozenset(routes)
        self._mounts = tuple(mounts)

    def _route(self, path: str) -> str:
        """The route a path belongs to, so metric labels stay a small fixed set."""
        if path in self._routes:
            return path
        for mount in self._mounts:
            if path == mount or path.startswith(mount + "/"):
                return mount
        return "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        incoming = Incoming(receive, headers)  # the app reads through it: `complete` is known
        request_id = request_id_from(headers.get(b"x-request-id"))
        token = logs.request_id.set(request_id)
        stamp = request_id.encode()
        id_headers = [(b"x-request-id", stamp), (b"x-typesafe-request-id", stamp)]
        status = 0
        answered = False  # the response's last body message has been sent
        started = time.perf_counter()
        by = ""  # the access line's ` key <id>`: which key authenticated the request

        async def send_with_id(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *id_headers]}
            elif not message.get("more_body", False):
                answered = True
            await send(message)

        path = scope["path"]
        route = self._route(path)
        method = scope["method"] if scope["method"] in _METHODS else "other"
        metrics.HTTP_IN_FLIGHT.inc()
        with tracing.span(
            f"{method} {route}",
            kind="server",
            parent=tracing.extract(headers),
            attributes={"http.request.method": method, "http.route": route},
            request_id=request_id,
        ) as span:
            try:
                if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
                    await self._app(scope, incoming, send_with_id)
                elif self._keys is not None and not (by := self._keys.match(headers)):
                    challenge = self._keys.challenge(headers)
                    await send_error(
                        send_with_id, Unauthorized(), [(b"www-authenticate", challenge)]
                    )
                elif path in UNADMITTED_PATHS:
                    await self._app(scope, incoming, send_with_id)
                elif not self._service.ledger.enter(task := asyncio.current_task()):
                    await send_error(send_with_id, ShuttingDown(), [])
                else:
                    try:
                        await self._app(scope, incoming, send_with_id)
                    except asyncio.CancelledError:
                        if task is None or not self._service.ledger.was_cut(task):
                            raise
                        task.uncancel()  # the drain ran out: answer, never cut the connection
                        if not status:
                            await send_error(send_with_id, CUT_SHORT, [])
                        elif not answered:
                            await send_with_id({"type": "http.response.body", "body": b""})
                    finally:
                        self._service.ledger.leave(task)
            except Exception as exc:
                logs.log_failure(log, exc, path)
                if not status:
                    await send_error(send_with_id, DecidealotError(), [])
            finally:
                seconds = time.perf_counter() - started
                log.info("%s %s %d %.1fms%s", scope["method"], path, status, seconds * 1000, by)
                span.set({"http.response.status_code": status})
                if status >= 500:
                    span.fail(str(status))
                metrics.HTTP_IN_FLIGHT.dec()
                metrics.HTTP_REQUESTS.inc(route=route, method=method, status=str(status))
                metrics.HTTP_DURATION.observe(seconds, route=route)
                logs.request_id.reset(token)
        if answered and status != 408 and not incoming.complete:  # a 408's body is not waited for
            await incoming.discard(self._largest_body, self._service.settings)


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
    """The app under `prefix` as well as at `/`, for a proxy that keeps the prefix and one that
    strips it. The prefix is cut from `path` and `raw_path`; `root_path` is left alone, since
    Litestar's router would cut it again wherever it recurs in a path."""

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


class ProbesOnly:
    """The app for the paths in `paths` only (DECIDEALOT_PROBE_PORT's /health and /metrics,
    with a proxy's prefix too); any other path is answered 404 here, so the second port never
    serves a decision."""

    def __init__(self, app: ASGIApp, paths: Collection[str]) -> None:
        self._app = app
        self._paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._paths:
            await self._app(scope, receive, send)
            return
        await send_json(send, 404, _PROBES_ONLY)


_PROBES_ONLY = msgspec.json.encode(
    ErrorBody("NOT_FOUND", "this port serves /health and /metrics only (DECIDEALOT_PROBE_PORT)")
)


class Cors:
    """CORS for the listed origins, by the rules of Litestar's `CORSConfig`. Any other origin,
    and a preflight asking for a method or header not allowed, passes on as if CORS were off (a
    401 without the key), so the browser refuses it; Litestar's own CORS middleware would answer
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
