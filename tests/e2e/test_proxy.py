"""Behind a reverse proxy and in browsers, over real HTTP: DECIDEALOT_ROOT_PATH (a proxy serving
the service at `https://host/decide/`, which strips the prefix or keeps it) and
DECIDEALOT_CORS_ORIGINS (pages on other origins calling the API).

A proxy forwards what the browser asked for, with or without the prefix; so each request
here is what one of the two kinds of proxy sends the server, and each URL a page or the
OpenAPI document makes is resolved as the browser would, from the public URL."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urljoin

import httpx
import pytest

from tests.support.servers import ALL_FAKES, RunningServer, start_server

PREFIX = "/decide"
PUBLIC = "https://host.example" + PREFIX + "/"
"""Where the proxy serves the service."""
KEY = "proxy-test-key"
ORIGIN = "https://app.example"
AUTH = {"Authorization": f"Bearer {KEY}"}
REQUEST = {"model": "von", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}
MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "proxy-test", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
PROXIES = {"strips": "", "keeps": PREFIX}
"""What each kind of proxy puts before the path it forwards."""


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(
        tmp_path_factory.mktemp("proxied"),
        **ALL_FAKES,
        DECIDEALOT_API_KEY=KEY,
        DECIDEALOT_ROOT_PATH=PREFIX + "/",
        DECIDEALOT_CORS_ORIGINS=f"{ORIGIN},http://localhost:5173",
    )
    yield server
    assert server.stop() == 0


def forwarded(server: RunningServer, proxy: str, public_url: str) -> str:
    """The URL `proxy` forwards a browser's `public_url` to."""
    assert public_url.startswith(PUBLIC[:-1]), public_url
    return server.url + PROXIES[proxy] + public_url[len(PUBLIC) - 1 :]


@pytest.mark.parametrize("proxy", PROXIES)
def test_every_route_answers_through_either_proxy(proxied: RunningServer, proxy: str) -> None:
    def at(path: str) -> str:
        return forwarded(proxied, proxy, urljoin(PUBLIC, path))

    with httpx.Client(timeout=30) as client:
        assert client.get(at("health")).json()["status"] == "ok"
        assert client.get(at("v1/models")).status_code == 401
        models = client.get(at("v1/models"), headers=AUTH)
        assert models.status_code == 200
        assert "von" in {m["name"] for m in models.json()["models"]}
        decided = client.post(at("v1/systemone"), json=REQUEST, headers=AUTH)
        assert decided.status_code == 200, decided.text
        batch = client.post(at("v1/systemone/batch"), json={"requests": [REQUEST]}, headers=AUTH)
        assert batch.status_code == 200, batch.text
        mcp = client.post(at("mcp"), json=MCP_INIT, headers=AUTH | MCP_HEADERS)
        assert mcp.status_code == 200, mcp.text
        assert "serverInfo" in mcp.text
        assert client.get(at("nope"), headers=AUTH).status_code == 404


@pytest.mark.parametrize("proxy", PROXIES)
def test_the_docs_page_and_its_document_work_under_the_prefix(
    proxied: RunningServer, proxy: str
) -> None:
    """The page's own links, the document it loads and the calls Swagger makes from that
    document all resolve, from the public URL, to routes the proxy reaches."""
    page_url = urljoin(PUBLIC, "docs")
    with httpx.Client(timeout=30) as client:
        page = client.get(forwarded(proxied, proxy, page_url))
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        for asset in ("docs/assets/swagger-ui.css", "docs/assets/swagger-ui-bundle.js"):
            assert f'"{asset}"' in page.text
            fetched = client.get(forwarded(proxied, proxy, urljoin(page_url, asset)))
            assert fetched.status_code == 200, asset
        document_url = urljoin(page_url, "openapi.json")
        document = client.get(forwarded(proxied, proxy, document_url)).json()
        assert document["servers"] == [{"url": PREFIX}]
        server_url = urljoin(document_url, document["servers"][0]["url"])
        assert server_url == PUBLIC[:-1]
        assert client.get(forwarded(proxied, proxy, server_url + "/health")).status_code == 200
        decided = client.post(
            forwarded(proxied, proxy, server_url + "/v1/systemone"), json=REQUEST, headers=AUTH
        )
        assert decided.status_code == 200
        # /docs/ sends the browser to /docs relative to where it is: under the prefix
        slash = client.get(forwarded(proxied, proxy, urljoin(PUBLIC, "docs/")))
        assert slash.status_code == 308
        assert urljoin(urljoin(PUBLIC, "docs/"), slash.headers["location"]) == page_url


def test_only_the_whole_prefix_is_taken_off(proxied: RunningServer) -> None:
    with httpx.Client(timeout=30) as client:
        assert client.get(proxied.url + "/decidex/health", headers=AUTH).status_code == 404
        assert client.get(proxied.url + "/decide/decide/health", headers=AUTH).status_code == 404


def test_without_a_root_path_the_document_names_no_server(gateway: RunningServer) -> None:
    assert "servers" not in httpx.get(gateway.url + "/openapi.json").json()
    assert httpx.get(gateway.url + "/decide/health").status_code == 404


# -- CORS -------------------------------------------------------------------------------------


def preflight(url: str, origin: str, method: str = "POST", headers: str = "") -> httpx.Response:
    asked = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers:
        asked["Access-Control-Request-Headers"] = headers
    return httpx.options(url, headers=asked, timeout=30)


def test_a_listed_origins_preflight_is_answered_without_a_key(proxied: RunningServer) -> None:
    answer = preflight(
        proxied.url + "/v1/systemone", ORIGIN, headers="authorization, content-type, x-request-id"
    )
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert "Origin" in answer.headers["vary"]
    assert {"GET", "POST"} <= set(answer.headers["access-control-allow-methods"].split(", "))
    allowed = {h.lower() for h in answer.headers["access-control-allow-headers"].split(", ")}
    assert {"authorization", "content-type", "x-request-id", "mcp-protocol-version"} <= allowed
    mcp = preflight(proxied.url + PREFIX + "/mcp", "http://localhost:5173", headers="authorization")
    assert mcp.status_code == 204
    assert mcp.headers["access-control-allow-origin"] == "http://localhost:5173"


@pytest.mark.parametrize(
    ("origin", "method", "headers"),
    [
        ("https://evil.example", "POST", ""),
        ("https://app.example.evil", "POST", ""),
        (ORIGIN, "DELETE", ""),
        (ORIGIN, "POST", "x-secret-header"),
    ],
)
def test_other_preflights_get_no_cors_answer(
    proxied: RunningServer, origin: str, method: str, headers: str
) -> None:
    answer = preflight(proxied.url + "/v1/systemone", origin, method, headers)
    assert answer.status_code == 401  # as any request without the key
    assert "access-control-allow-origin" not in answer.headers


def test_a_listed_origin_can_read_every_answer(proxied: RunningServer) -> None:
    """The answer, the key's 401 and a 404 alike carry what lets the page read them."""
    origin = {"Origin": ORIGIN}
    with httpx.Client(timeout=30) as client:
        answers = [
            client.post(proxied.url + "/v1/systemone", json=REQUEST, headers=origin | AUTH),
            client.post(proxied.url + "/v1/systemone", json=REQUEST, headers=origin),
            client.get(proxied.url + "/nope", headers=origin | AUTH),
        ]
        assert [a.status_code for a in answers] == [200, 401, 404]
        for answer in answers:
            assert answer.headers["access-control-allow-origin"] == ORIGIN
            exposed = answer.headers["access-control-expose-headers"].split(", ")
            expected = {"x-request-id", "retry-after", "www-authenticate", "decidealot-truncated"}
            assert expected <= set(exposed)
        mcp = client.post(proxied.url + "/mcp", json=MCP_INIT, headers=origin | AUTH | MCP_HEADERS)
        assert mcp.status_code == 200, mcp.text  # the MCP transport's Origin check allows it
        assert mcp.headers["access-control-allow-origin"] == ORIGIN
        other = client.get(proxied.url + "/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_cors_is_off_by_default(gateway: RunningServer) -> None:
    answer = preflight(gateway.url + "/v1/systemone", ORIGIN, headers="content-type")
    assert not any(name.startswith("access-control-") for name in answer.headers)
    plain = httpx.get(gateway.url + "/health", headers={"Origin": ORIGIN})
    assert not any(name.startswith("access-control-") for name in plain.headers)


@pytest.fixture(scope="module")
def any_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(
        tmp_path_factory.mktemp("any-origin"),
        **ALL_FAKES,
        DECIDEALOT_API_KEY=KEY,
        DECIDEALOT_CORS_ORIGINS="*",
    )
    yield server
    assert server.stop() == 0


def test_any_origin_opens_the_api_but_not_mcp(any_origin: RunningServer) -> None:
    """`*` lets every page read the REST API's answers; `/mcp` keeps its DNS-rebinding guard,
    so a page on an origin nobody listed cannot call the tools through a rebound name."""
    origin = {"Origin": "https://anywhere.example"}
    with httpx.Client(timeout=30) as client:
        api = client.post(any_origin.url + "/v1/systemone", json=REQUEST, headers=origin | AUTH)
        assert api.status_code == 200
        assert api.headers["access-control-allow-origin"] == "*"
        mcp = client.post(
            any_origin.url + "/mcp", json=MCP_INIT, headers=origin | AUTH | MCP_HEADERS
        )
        assert mcp.status_code == 403, mcp.text
        local = {"Origin": "http://localhost:5173"}  # the loopback default still holds
        mcp = client.post(
            any_origin.url + "/mcp", json=MCP_INIT, headers=local | AUTH | MCP_HEADERS
        )
        assert mcp.status_code == 200, mcp.text
