"""`GET /docs`: Swagger UI (the `swagger-ui-bundle-v2` package: Swagger UI 5, which reads OpenAPI
3.1) served by the service itself, so it works where no CDN is reachable. The page, its assets
and the document are public, like `/health`; with DECIDEALOT_API_KEY set the document declares
bearer security, and Swagger's Authorize button takes the token for the calls the page makes.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath
from litestar.response import Redirect
from swagger_ui_bundle import swagger_ui_path

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"

_ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "favicon-32x32.png": "image/png",
}
"""What the page loads, by file name in the bundle, with its media type."""

# Relative URLs, so the page also works under a path prefix added by a proxy.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Decidealot API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png">
</head><body>
<div id="ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({ url: "openapi.json", dom_id: "#ui", validatorUrl: null });
</script></body></html>"""


def route_handlers() -> list[HTTPRouteHandler]:
    """The page and its assets, read from the package now rather than on each request."""
    assets = {
        name: ((swagger_ui_path / name).read_bytes(), media_type)
        for name, media_type in _ASSETS.items()
    }

    @get(DOCS_PATH, sync_to_thread=False)
    def page(request: Request[Any, Any, Any]) -> Response[str] | Redirect:
        # the router takes /docs/ for /docs (and its `path` for the route's); the raw one tells
        if (request.scope.get("raw_path") or b"").endswith(b"/"):
            return Redirect("../docs", status_code=308)  # relative: a proxy's prefix is kept
        return Response(PAGE, media_type="text/html")

    @get(ASSETS_PATH + "/{name:str}", sync_to_thread=False)
    def asset(name: FromPath[str]) -> Response[bytes]:
        found = assets.get(name)
        if found is None:
            raise NotFoundException()
        body, media_type = found
        return Response(body, media_type=media_type, headers={"cache-control": "max-age=86400"})

    return [page, asset]
