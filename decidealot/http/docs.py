"""`GET /docs`: Swagger UI served by the service itself, so it works where no CDN is reachable.

The assets come from the `swagger-ui-bundle-v2` package (Swagger UI 5, which reads OpenAPI
3.1), read once when the app is built. The page and its assets are static and public, like
`/health`; the document they load (`/openapi.json`) is not when DECIDEALOT_API_KEY is set, so
the page asks for the bearer token, sends it with every request it makes, the document's
included, and keeps it only in the tab's session storage.
"""

from __future__ import annotations

from litestar import Response, get
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath
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
<style>#token{font-family:sans-serif;padding:8px 20px;background:#f0f0f0}</style>
</head><body>
<form id="token"><label>Bearer token (when DECIDEALOT_API_KEY is set):
<input id="key" type="password" autocomplete="off" size="40"></label>
<button type="submit">Use</button></form>
<div id="ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script>
const STORE = "decidealot-token";
function load() {
  const token = sessionStorage.getItem(STORE);
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#ui",
    validatorUrl: null,
    requestInterceptor: (request) => {
      if (token && !request.headers.Authorization) {
        request.headers.Authorization = "Bearer " + token;
      }
      return request;
    },
    onComplete: () => { if (token) window.ui.preauthorizeApiKey("bearer", token); },
  });
}
document.getElementById("token").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(STORE, document.getElementById("key").value);
  load();
});
load();
</script></body></html>"""


def route_handlers() -> list[HTTPRouteHandler]:
    """The page and its assets, read from the package now rather than on each request."""
    assets = {
        name: ((swagger_ui_path / name).read_bytes(), media_type)
        for name, media_type in _ASSETS.items()
    }

    @get(DOCS_PATH, sync_to_thread=False)
    def page() -> Response[str]:
        return Response(PAGE, media_type="text/html")

    @get(ASSETS_PATH + "/{name:str}", sync_to_thread=False)
    def asset(name: FromPath[str]) -> Response[bytes]:
        found = assets.get(name)
        if found is None:
            raise NotFoundException()
        body, media_type = found
        return Response(body, media_type=media_type, headers={"cache-control": "max-age=86400"})

    return [page, asset]
