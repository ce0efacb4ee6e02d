"""The served OpenAPI document is one tools can trust, and `/docs` works offline, over real HTTP.

Schemathesis runs with every check it has: its CLI (`schemathesis run <base>/openapi.json -c
all`, each phase: examples, coverage with undeclared methods and missing headers, fuzzing)
against the gateway and a secured server, and its generated valid and invalid cases per
operation with every response check. Cases are sent exactly as generated: `model` is the
enum of the catalog's names, so a schema-valid body is never refused.

Cases come from each operation's hypothesis strategy rather than schemathesis' pytest plugin,
whose lazy fixture loader does not run under pytest 9.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from swagger_ui_bundle import swagger_ui_path

from decidealot import registry
from decidealot.http import openapi
from decidealot.validation import requests as validation
from tests.support.mcp_clients import MCP_HEADERS, sse_json
from tests.support.servers import ALL_FAKES, RunningServer, start_server

load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 20}
KEY = "schema-key-Wd4Ns8"
BEARER = {"Authorization": f"Bearer {KEY}"}
_PATHS = openapi.document(registry.settings())["paths"]
OPERATIONS = [(method.upper(), path) for path, methods in _PATHS.items() for method in methods]
CASES = [
    (method, path, mode)
    for method, path in OPERATIONS
    for mode in EXAMPLES
    # negative cases need an input to break; operations without one have none
    if mode == GenerationMode.POSITIVE or "requestBody" in _PATHS[path][method.lower()]
]


@pytest.fixture(scope="module")
def served_schema(gateway: RunningServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(gateway.url + "/openapi.json")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("secured"), DECIDEALOT_API_KEY=KEY)
    yield server
    assert server.stop() == 0


def run_cli(url: str, folder: Path, *extra: str) -> None:
    """`schemathesis run <url>/openapi.json -c all`, seeded so CI sees the same cases."""
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "run", url + "/openapi.json"),
        *("-c", "all", "--seed", "20261201", "--max-examples", "25", "-w", "1", *extra),
    ]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout


def test_every_operation_is_covered(served_schema: schemathesis.BaseSchema) -> None:
    served = {(op.ok().method.upper(), op.ok().path) for op in served_schema.get_all_operations()}
    assert served == set(OPERATIONS)


def test_the_schemathesis_cli_passes_every_check(gateway: RunningServer, tmp_path: Path) -> None:
    run_cli(gateway.url, tmp_path)


def test_the_schemathesis_cli_passes_every_check_with_a_key(
    secured: RunningServer, tmp_path: Path
) -> None:
    run_cli(secured.url, tmp_path, "-H", f"Authorization: Bearer {KEY}")


@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m}-{p}-{g.value}" for m, p, g in CASES]
)
def test_responses_match_the_served_schema(
    served_schema: schemathesis.BaseSchema, method: str, path: str, mode: GenerationMode
) -> None:
    operation = served_schema[path][method]
    strategy = operation.as_strategy(generation_mode=mode)

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=ALL_CHECKS, timeout=10)

    check()


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_a_secured_server_matches_its_schema_with_and_without_the_key(
    secured: RunningServer, method: str, path: str
) -> None:
    """With DECIDEALOT_API_KEY the document declares bearer security and 401s; every response,
    refused or not, must match it."""
    schema = schemathesis.openapi.from_url(secured.url + "/openapi.json", headers=BEARER)
    operation = schema[path][method]

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(max_examples=8, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def check(case: schemathesis.Case) -> None:
        refused = case.call_and_validate(checks=ALL_CHECKS, timeout=10)
        assert refused.status_code == (200 if path == "/health" else 401)
        case.call_and_validate(checks=ALL_CHECKS, timeout=10, headers=BEARER)

    check()


# -- the details schemathesis found ------------------------------------------------------------


def test_undeclared_methods_get_405_naming_the_declared_ones(gateway: RunningServer) -> None:
    """RFC 9110: a 405 carries `Allow`; it lists what the document declares (and Litestar's
    automatic OPTIONS), in our envelope."""
    for path, declared in _PATHS.items():
        for method in ("PUT", "PATCH", "DELETE", "TRACE", "GET", "POST"):
            if method.lower() in declared:
                continue
            response = httpx.request(method, gateway.url + path)
            assert response.status_code == 405, (method, path)
            allowed = {m.strip().lower() for m in response.headers["allow"].split(",")}
            assert allowed - {"options"} == set(declared), (method, path, allowed)
            assert response.json()["code"] == "METHOD_NOT_ALLOWED"
    assert httpx.get(gateway.url + "/mcp").headers["allow"] == "POST"


def test_mcp_without_a_content_type_gets_our_envelope(gateway: RunningServer) -> None:
    message = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    for body in (b"", message):
        response = httpx.post(
            gateway.url + "/mcp", content=body, headers={"Accept": MCP_HEADERS["Accept"]}
        )
        assert response.status_code == 415
        assert response.headers["content-type"] == "application/json"
        assert response.json()["code"] == "UNSUPPORTED_MEDIA_TYPE"
        assert "application/json" in response.json()["message"]


def test_mcp_refuses_what_the_document_calls_invalid(gateway: RunningServer) -> None:
    """The SDK's own parse is lax; a body outside its JSON-RPC schema is a JSON-RPC invalid
    request (400), with the id when it has one, and a valid message still reaches it."""
    invalid = [
        ({"jsonrpc": "2.0", "id": None, "error": {"code": False, "message": ""}}, None),
        ({"jsonrpc": "2.0", "id": 1, "result": []}, 1),
        ({"jsonrpc": "1.0", "id": "a", "method": "tools/list"}, "a"),
    ]
    for message, request_id in invalid:
        response = httpx.post(gateway.url + "/mcp", json=message, headers=MCP_HEADERS)
        assert response.status_code == 400, message
        assert response.headers["content-type"] == "application/json"
        refused = response.json()
        assert refused["jsonrpc"] == "2.0" and refused["id"] == request_id, refused
        assert refused["error"]["code"] == -32600, refused
    valid = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert httpx.post(gateway.url + "/mcp", json=valid, headers=MCP_HEADERS).status_code == 200
    # a JSON media type the REST API takes reaches the SDK as plain JSON, not its text 400
    suffixed = MCP_HEADERS | {"Content-Type": "application/vnd.example+json"}
    assert httpx.post(gateway.url + "/mcp", json=valid, headers=suffixed).status_code == 200


def _validator(document: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(root)


def test_model_lists_the_catalog_as_it_is_now(launch: Callable[..., RunningServer]) -> None:
    """Hosted names included and followed as the catalog changes; a temperature is valid only
    for the selectors that take one; a hosted catalog that is down leaves `model` open."""
    server = launch(**ALL_FAKES)
    names = [m["name"] for m in httpx.get(server.url + "/v1/models").json()["models"]]
    document = httpx.get(server.url + "/openapi.json").json()
    request = document["components"]["schemas"]["SystemOneRequest"]
    assert request["properties"]["model"]["enum"] == names
    assert {"laya", "von-1.1", "clm", "jev-latest"} <= set(names)

    body = {"state": "s", "questions": {"q": {"type": "noul"}}}
    validator = _validator(document, "SystemOneRequest")
    assert validator.is_valid({**body, "model": "clm", "config": {"temperature": 0.5}})
    assert not validator.is_valid({**body, "model": "laya", "config": {"temperature": 0.5}})
    assert not validator.is_valid({**body, "model": "not-a-model"})
    refused = httpx.post(
        server.url + "/v1/systemone",
        json={**body, "model": "laya", "config": {"temperature": 0.5}},
    )
    assert refused.status_code == 422

    server.jev_catalog.write_text(json.dumps(["jev-9.9"]))
    request = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]
    assert "jev-9.9" in request["SystemOneRequest"]["properties"]["model"]["enum"]
    server.jev_catalog.write_text('"fail"')
    down = httpx.get(server.url + "/openapi.json")
    assert down.status_code == 200
    model = down.json()["components"]["schemas"]["SystemOneRequest"]["properties"]["model"]
    assert "enum" not in model and "GET /v1/models" in model["description"]


def test_an_empty_catalog_still_gives_a_valid_schema() -> None:
    components = openapi.document(registry.settings(), {})["components"]["schemas"]
    request = components["SystemOneRequest"]
    assert request["properties"]["model"]["enum"] == [] and "anyOf" not in request
    jsonschema.Draft202012Validator.check_schema(request)


def test_numbers_are_bounded_as_the_parser_bounds_them(gateway: RunningServer) -> None:
    """JSON Schema knows numbers by value: 1e20 and 100000000000000000000 are both outside the
    64-bit range the document states, so the service refuses both."""
    document = httpx.get(gateway.url + "/openapi.json").json()
    validator = _validator(document, "SystemOneRequest")
    for number in (b"1e20", b"100000000000000000000", b"-1e19"):
        raw = b'{"model":"von","state":{"n":' + number + b'},"questions":{"q":{"type":"noul"}}}'
        assert not validator.is_valid(json.loads(raw))
        response = httpx.post(
            gateway.url + "/v1/systemone", content=raw, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 422, number
        assert response.json()["detail"][0]["type"] == "json_invalid"
    inside = b'{"model":"von","state":{"n":[1.5e18,-9e18,0.25]},"questions":{"q":{"type":"noul"}}}'
    assert validator.is_valid(json.loads(inside))
    assert httpx.post(gateway.url + "/v1/systemone", content=inside).status_code == 200


def test_openapi_and_mcp_state_the_same_bounds(gateway: RunningServer) -> None:
    """Questions, choice options, score levels and temperature: one source, both documents."""
    components = httpx.get(gateway.url + "/openapi.json").json()["components"]["schemas"]
    listing = httpx.post(
        gateway.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers=MCP_HEADERS,
    )
    tools = {tool["name"]: tool for tool in sse_json(listing)["result"]["tools"]}
    mcp = tools["system_one"]["inputSchema"]
    in_batch = tools["system_one_batch"]["inputSchema"]["$defs"]

    def bounds(schema: dict[str, Any]) -> dict[str, Any]:
        keys = ("minProperties", "maxProperties", "propertyNames", "minItems", "maxItems")
        return {key: schema[key] for key in keys if key in schema}

    questions = bounds(mcp["properties"]["questions"])
    assert questions == bounds(components["SystemOneRequest"]["properties"]["questions"])
    assert questions == bounds(in_batch["SystemOneRequest"]["properties"]["questions"])
    assert questions["maxProperties"] == validation.MAX_QUESTIONS
    for name in ("ChoiceQuestion", "ScoreQuestion"):
        criteria = bounds(mcp["$defs"][name]["properties"]["criteria"])
        assert criteria == bounds(components[name]["properties"]["criteria"])
        assert criteria == bounds(in_batch[name]["properties"]["criteria"])
    choice = mcp["$defs"]["ChoiceQuestion"]["properties"]["criteria"]
    score = mcp["$defs"]["ScoreQuestion"]["properties"]["criteria"]
    assert choice["maxProperties"] == validation.MAX_CHOICE_OPTIONS
    assert (score["minItems"], score["maxItems"]) == (
        validation.MIN_SCORE_LEVELS,
        validation.MAX_SCORE_LEVELS,
    )
    temperature = mcp["properties"]["config"]["properties"]["temperature"]
    openapi_config = components["SystemOneRequest"]["properties"]["config"]
    assert temperature == openapi_config["properties"]["temperature"]
    assert temperature["maximum"] == validation.MAX_TEMPERATURE


# -- /docs -----------------------------------------------------------------------------------

_LINKS = re.compile(r'(?:src|href)="([^"]+)"')


def test_docs_and_their_assets_are_served_offline_and_public(secured: RunningServer) -> None:
    """Every asset the page loads is a relative URL this service answers, from the
    swagger-ui-bundle package (nothing reaches a CDN or the hub, which are unreachable here);
    the page, its assets and the document it loads need no key; the document declares bearer
    security, so Swagger's Authorize button takes the key (tests/e2e/test_docs_page.py)."""
    page = httpx.get(secured.url + "/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    links = _LINKS.findall(page.text)
    assert {"docs/assets/swagger-ui.css", "docs/assets/swagger-ui-bundle.js"} <= set(links)
    for link in links:
        assert "//" not in link and ":" not in link, link  # relative: served by this service
        asset = httpx.get(urljoin(secured.url + "/docs", link))
        assert asset.status_code == 200, link
        assert asset.content == (swagger_ui_path / link.rsplit("/", 1)[1]).read_bytes()
        assert asset.headers["cache-control"] == "max-age=86400"
    assert 'url: "openapi.json"' in page.text and "validatorUrl: null" in page.text
    assert "<input" not in page.text  # one token control: Swagger's own Authorize

    assert httpx.get(secured.url + "/docs/assets/index.html").status_code == 404
    public = httpx.get(secured.url + "/openapi.json")
    assert public.status_code == 200 and KEY not in public.text
    document = httpx.get(secured.url + "/openapi.json", headers=BEARER).json()
    assert document == public.json()
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
    }
    assert document["security"] == [{"bearer": []}]
    scrape = httpx.get(secured.url + "/metrics", headers=BEARER).text
    routes = {
        sample.labels["route"]
        for family in text_string_to_metric_families(scrape)
        if family.name == "decidealot_http_requests"
        for sample in family.samples
    }
    assert {"/docs", "/docs/assets"} <= routes and not any("{" in r for r in routes)
