"""The Litestar app: routes over the service, error envelopes, wrapped in the gateway layer.
`GET /docs` is Swagger UI 5 from the `swagger-ui-bundle-v2` package, served here so that it works
where no CDN is reachable; public, like the document, whose bearer security lets Swagger's
Authorize button take the key for the calls the page makes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect
from swagger_ui_bundle import swagger_ui_path

from decidealot import logs, metrics
from decidealot.asgi.body import CLIENT_GONE, ClientGone, read_body, unless_gone
from decidealot.asgi.middleware import ASGIApp, Cors, Gateway, RootPath
from decidealot.contract import TRUNCATED_HEADER, ErrorBody, truncated_header
from decidealot.errors import DecidealotError, ShuttingDown
from decidealot.http import openapi
from decidealot.http.connections import open_connections
from decidealot.mcp.http import MCP_PATH, McpEndpoint
from decidealot.service import Service
from decidealot.validation.requests import validate_batch, validate_request
from decidealot.validation.strict_json import parse_json

log = logging.getLogger("decidealot.http")

_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}
_DOCS_ASSETS_PATH = "/docs/assets"
_DOCS_ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "favicon-32x32.png": "image/png",
}  # what the Swagger page loads

# Relative URLs, so the page also works under a path prefix added by a proxy.
_DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Decidealot API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png">
</head><body>
<div id="ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({ url: "openapi.json", dom_id: "#ui", validatorUrl: null });
</script></body></html>"""


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(
        msgspec.json.encode(value), status_code=status, media_type=MediaType.JSON, headers=headers
    )


def _on_error(_: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    if isinstance(exc, DecidealotError):
        return _json(exc.envelope(), exc.status, exc.headers)
    if isinstance(exc, HTTPException):
        fallback = "BAD_REQUEST" if exc.status_code < 500 else "INTERNAL_ERROR"
        code = _HTTP_CODES.get(exc.status_code, fallback)
        # Litestar's 405 names the route's methods in `Allow`, as RFC 9110 asks
        return _json(ErrorBody(code, str(exc.detail)), exc.status_code, exc.headers)
    logs.log_failure(log, exc, "a route")
    return _json(DecidealotError().envelope(), 500)


def create_app(service: Service) -> ASGIApp:
    """REST routes and the `/mcp` mount behind the gateway layer, like any route; in front of
    it, when set, the path prefix and CORS (`decidealot.asgi.middleware`)."""
    settings = service.settings
    mcp = McpEndpoint(service)

    @get("/health", sync_to_thread=False)
    def health() -> Response[bytes]:
        if service.ledger.draining:
            raise ShuttingDown()
        return _json(service.health())

    @get("/v1/status", sync_to_thread=False)
    def status() -> Response[bytes]:
        """What runs, for an operator: behind the key, unlike `/health` (the contract's)."""
        return _json(service.status())

    @get("/v1/models")
    async def models() -> Response[bytes]:
        return _json(await service.models())

    async def decide(request: Request[Any, Any, Any], batch: bool) -> Response[bytes]:
        """Rejections are answered here, not raised: they are the hot path under bad clients.
        What an early refusal leaves of the body unread, the gateway drops."""
        try:
            headers = dict(request.scope["headers"])
            body = parse_json(await read_body(request.receive, headers, settings))
            if batch:
                limit = settings.max_batch_requests
                validated = await validate_batch(body, service.catalog, limit)
                work = service.executor.decide_batch(validated)
            else:
                work = service.executor.decide(await validate_request(body, service.catalog))
            answered = await unless_gone(request.receive, work)
            cuts = answered.cuts  # a model read a state only in part: docs/api.md
            truncated = {TRUNCATED_HEADER: truncated_header(cuts)} if cuts else None
            return _json(answered.body, headers=truncated)
        except DecidealotError as exc:
            return _on_error(request, exc)
        except ClientGone:
            return Response(b"", status_code=CLIENT_GONE)

    @post("/v1/systemone")
    async def systemone(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await decide(request, batch=False)

    @post("/v1/systemone/batch")
    async def systemone_batch(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await decide(request, batch=True)

    @post("/v1/models/unload")
    async def unload() -> Response[bytes]:
        return _json(await service.executor.unload())

    @get("/openapi.json")
    async def openapi_json() -> Response[bytes]:
        models = await openapi.accepted_models(service.catalog)
        return _json(openapi.document(settings, models))

    # read from the package once, not on each request
    assets = {name: ((swagger_ui_path / name).read_bytes(), m) for name, m in _DOCS_ASSETS.items()}

    @get("/docs", sync_to_thread=False)
    def docs_page(request: Request[Any, Any, Any]) -> Response[str] | Redirect:
        # the router takes /docs/ for /docs (and its `path` for the route's); the raw one tells
        if (request.scope.get("raw_path") or b"").endswith(b"/"):
            return Redirect("../docs", status_code=308)  # relative: a proxy's prefix is kept
        return Response(_DOCS_PAGE, media_type="text/html")

    @get(_DOCS_ASSETS_PATH + "/{name:str}", sync_to_thread=False)
    def docs_asset(name: FromPath[str]) -> Response[bytes]:
        found = assets.get(name)
        if found is None:
            raise NotFoundException()
        body, media_type = found
        return Response(body, media_type=media_type, headers={"cache-control": "max-age=86400"})

    connections: int | None = None
    exposition = metrics.ServiceCollector(service.residency, service.ledger, lambda: connections)

    @get("/metrics")
    async def metrics_text() -> Response[bytes]:
        nonlocal connections
        # the kernel's socket tables, read off the event loop: about 10 ms per 1000 sockets
        connections = await asyncio.to_thread(open_connections, settings.port)
        return Response(exposition.render(), media_type=metrics.MEDIA_TYPE)

    handlers = [health, status, models, systemone, systemone_batch, unload, openapi_json]
    app = Litestar(
        route_handlers=[*handlers, docs_page, docs_asset, metrics_text, mcp.route],
        lifespan=[mcp.running()],
        exception_handlers={Exception: _on_error},
        on_startup=[service.start],
        on_shutdown=[service.close],
        openapi_config=None,
        request_max_body_size=None,
        debug=False,
        logging_config=None,
    )
    routes = {route.path for route in app.routes if "{" not in route.path} - {MCP_PATH}
    served: ASGIApp = Gateway(
        app, service, routes, mounts=[MCP_PATH, _DOCS_ASSETS_PATH], largest_body=mcp.body_limit
    )
    if settings.cors_origins:
        served = Cors(served, settings.cors_origins)
    if settings.root_path:
        served = RootPath(served, settings.root_path)
    return served
