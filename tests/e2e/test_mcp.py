"""The MCP server against the HTTP API it mirrors, through the official SDK's client.

Every MCP answer is compared with the HTTP API's answer to the same request on the same
server: the production server (`tests.server`: `decidealot.http.server.serve` over the fake
providers) over streamable HTTP at /mcp in both protocol eras, with and without a key;
`decidealot mcp --url` (a real stdio subprocess) forwarding to that server; and
`decidealot mcp` running providers itself (a real subprocess with hosted Jev against the fake
TypeSafe), compared with the HTTP app over the same settings.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from decidealot import registry
from decidealot.http.app import create_app
from decidealot.mcp.http import transport_security
from decidealot.mcp.server import ServiceBackend, ToolFailure
from decidealot.mcp.stdio import ForwardingBackend, main
from decidealot.mcp.tools import TOOLS
from decidealot.service import Service
from tests.support.fake_typesafe import FakeTypeSafe, serve
from tests.support.mcp_clients import in_tool_terms, over_http, over_stdio, tool_outcome
from tests.support.servers import ALL_FAKES, RunningServer, start_server

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "mcp-Test-k3y"
TYPESAFE_KEY = "typesafe-test-key"
ALLOWED_HOST = "decide.example.com"

# -- requests ----------------------------------------------------------------------------------

CHOICE = {
    "type": "choice",
    "instructions": "Route payment or refund questions to billing; software failures to tech.",
    "criteria": {"billing": "Payment or refund question", "technical": "Software failure"},
}
SCORE = {"type": "score", "criteria": ["routine", "important", {"level": "urgent"}]}
NOUL = {"type": "noul", "instructions": "Is human review needed?"}


def steered(model: str, tag: str, *, sleep: float = 0.0, fail: str | None = None) -> dict[str, Any]:
    """A request the fake providers answer after `sleep` seconds, or fail as `fail` says."""
    steer: dict[str, Any] = {"tag": tag, "sleep": sleep} | ({"fail": fail} if fail else {})
    return {"model": model, "state": {"fake": steer}, "questions": {"review": NOUL}}


REQUESTS: list[dict[str, Any]] = [
    {"model": "laya", "state": "A duplicate card payment.", "questions": {"queue": CHOICE}},
    {
        "model": "von-1.1.0",
        "state": {"operation": "delete", "reversible": False},
        "questions": {"urgency": SCORE, "review": NOUL},
        "config": {},
    },
    {
        "model": "clm",
        "state": ["first", "second"],
        "questions": {"queue": CHOICE},
        "config": {"temperature": 0.8},
    },
    {"model": "jev-1.13.0", "state": "A hosted decision.", "questions": {"review": NOUL}},
]

# The first item sleeps in its provider, so the items after it finish first.
BATCH = {
    "requests": [
        steered("laya-english", "slow", sleep=0.3),
        REQUESTS[3],
        REQUESTS[1],
        steered("laya", "again"),
    ]
}
BATCH_MODELS = ["laya-english", "jev-1.13.0", "von-1.1", "laya-english"]

INVALID_REQUESTS: list[dict[str, Any]] = [
    {"model": "unknown-model", "state": "anything", "questions": {"answer": {"type": "noul"}}},
    {"state": 3, "questions": {}, "extra": True},
    {"model": "laya", "state": "x", "questions": {"q": CHOICE}, "config": {"temperature": 1}},
    {"model": "von", "state": "x", "questions": {"q": {"type": "score", "criteria": []}}},
    steered("von", "input", fail="input"),
]

INVALID_BATCHES: list[dict[str, Any]] = [
    {"requests": []},
    {"requests": [REQUESTS[0], REQUESTS[1] | {"config": {"temperature": 0.5}}]},
    {"requests": [REQUESTS[0]], "other": 1},
    {"requests": [REQUESTS[0], steered("von", "input", fail="input")]},
]

FAILING_REQUESTS = [steered("von", "down", fail="unavailable"), steered("laya", "x", fail="crash")]


# -- clients -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A production server that wants a key and is reached as ALLOWED_HOST."""
    server = start_server(
        tmp_path_factory.mktemp("mcp-keyed"),
        DECIDEALOT_API_KEY=API_KEY,
        DECIDEALOT_MCP_ALLOWED_HOSTS=ALLOWED_HOST,
    )
    yield server
    assert server.stop() == 0


async def _http(api: httpx.AsyncClient, path: str, body: Any = None) -> tuple[int, Any]:
    if body is None:
        response = await (api.get(path) if path == "/v1/models" else api.post(path))
    else:
        response = await api.post(path, json=body)
    return response.status_code, response.json()


async def _tool(client: Client, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    return tool_outcome(await client.call_tool(name, arguments))


def _failed(envelope: Any) -> tuple[bool, Any]:
    """The tool error an HTTP error body comes back as."""
    return True, in_tool_terms(envelope)


async def _assert_parity(client: Client, api: httpx.AsyncClient) -> None:
    """Every operation, valid or not, answers over MCP exactly as over HTTP."""
    for body in REQUESTS:
        status, expected = await _http(api, "/v1/systemone", body)
        assert status == 200, expected
        assert await _tool(client, "system_one", body) == (False, expected)

    status, expected = await _http(api, "/v1/systemone/batch", BATCH)
    assert status == 200, expected
    assert [result["model"] for result in expected["results"]] == BATCH_MODELS
    assert await _tool(client, "system_one_batch", BATCH) == (False, expected)

    for body in INVALID_REQUESTS:
        status, expected = await _http(api, "/v1/systemone", body)
        assert status == 422 and expected["detail"], expected
        assert await _tool(client, "system_one", body) == _failed(expected)
    for body in INVALID_BATCHES:
        status, expected = await _http(api, "/v1/systemone/batch", body)
        assert status == 422 and expected["detail"], expected
        assert await _tool(client, "system_one_batch", body) == _failed(expected)
    for body in FAILING_REQUESTS:
        status, expected = await _http(api, "/v1/systemone", body)
        assert status == 503 and expected["code"] == "PROVIDER_UNAVAILABLE", expected
        assert await _tool(client, "system_one", body) == _failed(expected)

    status, expected = await _http(api, "/v1/models")
    assert status == 200, expected
    assert await _tool(client, "list_models", {}) == (False, expected)

    # unloading is stateful: start from nothing loaded, load laya before each unload
    await _http(api, "/v1/models/unload")
    await _http(api, "/v1/systemone", REQUESTS[0])
    status, expected = await _http(api, "/v1/models/unload")
    assert status == 200 and {"name": "laya", "wasLoaded": True} in expected["providers"]
    await _http(api, "/v1/systemone", REQUESTS[0])
    assert await _tool(client, "unload_models", {}) == (False, expected)


# -- streamable HTTP ---------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_answers_equal_the_http_api(gateway: RunningServer, mode: str) -> None:
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=30) as api,
        over_http(gateway.url, mode=mode) as client,
    ):
        await _assert_parity(client, api)


async def test_tools_publish_the_http_schemas(gateway: RunningServer) -> None:
    async with over_http(gateway.url) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert list(tools) == ["system_one", "system_one_batch", "list_models", "unload_models"]
    for tool in tools.values():
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
        assert "Not for" in (tool.description or "")
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)

    system_one = tools["system_one"].input_schema
    assert set(system_one["properties"]) == {"model", "state", "questions", "config"}
    assert set(system_one["required"]) == {"model", "state", "questions"}
    for body in REQUESTS:
        jsonschema.validate(body, system_one)
    jsonschema.validate(BATCH, tools["system_one_batch"].input_schema)
    for wrong in (INVALID_REQUESTS[1], {**REQUESTS[0], "questions": {"q": {"type": "box"}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, system_one)

    # The output schemas describe what the HTTP API really returns.
    async with httpx.AsyncClient(base_url=gateway.url) as api:
        for body in REQUESTS:
            jsonschema.validate(
                (await _http(api, "/v1/systemone", body))[1], tools["system_one"].output_schema
            )
        batch = (await _http(api, "/v1/systemone/batch", BATCH))[1]
        jsonschema.validate(batch, tools["system_one_batch"].output_schema)
        models = (await _http(api, "/v1/models"))[1]
        jsonschema.validate(models, tools["list_models"].output_schema)
        unloaded = (await _http(api, "/v1/models/unload"))[1]
        jsonschema.validate(unloaded, tools["unload_models"].output_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": "x", "answers": {}}, tools["system_one"].output_schema)


async def test_tools_list_the_model_names_now(launch: Callable[..., RunningServer]) -> None:
    """`model` in both input schemas is the enum of list_models' names as the catalog is when
    the tools are listed, hosted names included, as the OpenAPI document lists them; with the
    hosted catalog down it stays open and says so."""
    server = launch(**ALL_FAKES)

    async def model_properties() -> list[dict[str, Any]]:
        async with over_http(server.url) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        batch = tools["system_one_batch"].input_schema["$defs"]["SystemOneRequest"]
        return [
            tools["system_one"].input_schema["properties"]["model"],
            batch["properties"]["model"],
        ]

    async with httpx.AsyncClient(base_url=server.url) as api:
        names = [m["name"] for m in (await api.get("/v1/models")).json()["models"]]
        document = (await api.get("/openapi.json")).json()
    assert {"laya", "von-1.1", "clm", "jev-latest"} <= set(names)
    assert (
        document["components"]["schemas"]["SystemOneRequest"]["properties"]["model"]["enum"]
        == names
    )
    for model in await model_properties():
        assert model["enum"] == names and "list_models" in model["description"]

    server.jev_catalog.write_text(json.dumps(["jev-9.9"]))
    assert all("jev-9.9" in model["enum"] for model in await model_properties())
    server.jev_catalog.write_text('"fail"')
    for model in await model_properties():
        assert "enum" not in model and "list_models" in model["description"]


async def test_http_needs_the_key(keyed: RunningServer) -> None:
    host = {"Host": ALLOWED_HOST}
    probe = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"} | host
    async with httpx.AsyncClient(base_url=keyed.url) as raw:
        for auth in (None, "Bearer wrong-key", f"Basic {API_KEY}", API_KEY):
            sent = accept | ({"Authorization": auth} if auth else {})
            response = await raw.post("/mcp", json=probe, headers=sent)
            assert response.status_code == 401
            assert response.json() == {
                "code": "UNAUTHORIZED",
                "message": "a valid bearer token is required",
                "details": {},
            }
    with pytest.raises(BaseExceptionGroup) as refused:
        async with over_http(keyed.url, host, mode="legacy") as client:
            await client.list_tools()
    assert refused.group_contains(MCPError)

    authorized = host | {"Authorization": f"Bearer {API_KEY}"}
    async with (
        httpx.AsyncClient(base_url=keyed.url, headers=authorized) as api,
        over_http(keyed.url, authorized) as client,
    ):
        assert [tool.name for tool in (await client.list_tools()).tools] == list(TOOLS)
        status, expected = await _http(api, "/v1/systemone", REQUESTS[1])
        assert status == 200
        assert await _tool(client, "system_one", REQUESTS[1]) == (False, expected)
    assert API_KEY not in keyed.log_file.read_text()


async def test_hosts_outside_the_allowed_list_are_refused(
    gateway: RunningServer, keyed: RunningServer
) -> None:
    probe = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient() as raw:
        # default: loopback names only
        evil = accept | {"Host": "evil.example"}
        assert (await raw.post(f"{gateway.url}/mcp", json=probe, headers=evil)).status_code == 421
        origin = accept | {"Origin": "http://evil.example"}
        assert (await raw.post(f"{gateway.url}/mcp", json=probe, headers=origin)).status_code == 403
        assert (await raw.post(f"{gateway.url}/mcp", json=probe, headers=accept)).status_code == 200
        # DECIDEALOT_MCP_ALLOWED_HOSTS replaces the default
        keyed_auth = accept | {"Authorization": f"Bearer {API_KEY}"}
        loopback = await raw.post(f"{keyed.url}/mcp", json=probe, headers=keyed_auth)
        assert loopback.status_code == 421
        named = await raw.post(
            f"{keyed.url}/mcp", json=probe, headers=keyed_auth | {"Host": ALLOWED_HOST}
        )
        assert named.status_code == 200


def test_allowed_hosts_setting() -> None:
    default = transport_security(())
    assert default.enable_dns_rebinding_protection
    assert {"localhost:*", "127.0.0.1:*", "[::1]:*"} <= set(default.allowed_hosts)
    named = transport_security(("decide.example.com", "10.0.0.5:8080", "[::1]"))
    assert named.allowed_hosts == [
        "decide.example.com",
        "decide.example.com:*",
        "10.0.0.5:8080",
        "[::1]",
        "[::1]:*",
    ]
    assert "https://decide.example.com" in named.allowed_origins
    assert not transport_security(("*",)).enable_dns_rebinding_protection


async def test_unknown_tool_and_extra_arguments(gateway: RunningServer) -> None:
    async with over_http(gateway.url) as client:
        assert await _tool(client, "list_models", {"verbose": True}) == (
            True,
            {
                "detail": [
                    {
                        "loc": ["body", "verbose"],
                        "msg": "Extra inputs are not permitted",
                        "type": "extra_forbidden",
                        "input": True,
                    }
                ]
            },
        )
        with pytest.raises(MCPError, match="unknown tool"):
            await client.call_tool("no_such_tool", {})


async def test_oversized_arguments_are_413() -> None:
    backend = ServiceBackend(Service(registry.settings(max_request_bytes=1024), providers=[]))
    with pytest.raises(ToolFailure) as failure:
        await backend.call("system_one", {**REQUESTS[0], "state": "x" * 2000})
    assert failure.value.status == 413
    assert failure.value.envelope["code"] == "REQUEST_TOO_LARGE"


# -- stdio -------------------------------------------------------------------------------------


@pytest.mark.smoke
async def test_stdio_forwarding_equals_the_http_api(gateway: RunningServer) -> None:
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=30) as api,
        over_stdio(["--url", gateway.url], {}, mode="auto") as client,
    ):
        assert [tool.name for tool in (await client.list_tools()).tools] == list(TOOLS)
        await _assert_parity(client, api)


async def test_stdio_forwarding_sends_the_key(keyed: RunningServer) -> None:
    """`--url` sends DECIDEALOT_API_KEY as the bearer token (to the /v1 routes, which the
    allowed-hosts check of /mcp does not guard)."""
    for key, expected_error in ((API_KEY, False), ("wrong-key", True)):
        async with over_stdio(["--url", keyed.url], {"DECIDEALOT_API_KEY": key}) as client:
            failed, body = await _tool(client, "list_models", {})
        assert failed is expected_error
        if failed:
            assert body == {
                "code": "UNAUTHORIZED",
                "message": "a valid bearer token is required",
                "details": {},
            }
        else:
            assert "laya" in {model["name"] for model in body["models"]}


@pytest.fixture(scope="module")
def typesafe() -> Iterator[FakeTypeSafe]:
    with serve(FakeTypeSafe(TYPESAFE_KEY)) as fake:
        yield fake


async def test_stdio_runs_providers_itself(typesafe: FakeTypeSafe, tmp_path: Path) -> None:
    env = {
        "DECIDEALOT_MODEL_DIR": str(tmp_path),
        "DECIDEALOT_LAYA_ENABLED": "false",
        "DECIDEALOT_VON_ENABLED": "false",
        "DECIDEALOT_TYPESAFE_API_KEY": TYPESAFE_KEY,
        "DECIDEALOT_TYPESAFE_BASE_URL": typesafe.url,
    }
    settings = registry.settings(
        model_dir=tmp_path,
        laya_enabled=False,
        von_enabled=False,
        typesafe_api_key=TYPESAFE_KEY,
        typesafe_base_url=typesafe.url,
    )
    service = Service(settings)  # the HTTP API over the same settings, in this process
    await service.start()
    hosted = [
        {**REQUESTS[0], "model": "jev-latest"},
        {**REQUESTS[1], "model": "jev-preview"},
        {**REQUESTS[3], "model": "jev-1.13.0"},
    ]
    batch = {"requests": [hosted[2], hosted[0], hosted[1]]}
    try:
        async with (
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(service)), base_url="http://api"
            ) as api,
            over_stdio([], env) as client,
        ):
            answers = []
            for body in hosted:
                status, expected = await _http(api, "/v1/systemone", body)
                assert status == 200, expected
                assert await _tool(client, "system_one", body) == (False, expected)
                answers.append(expected["answers"])
            for body in INVALID_REQUESTS[:4]:
                status, expected = await _http(api, "/v1/systemone", body)
                assert status == 422, expected
                assert await _tool(client, "system_one", body) == _failed(expected)
            status, expected = await _http(api, "/v1/systemone/batch", batch)
            assert status == 200
            assert await _tool(client, "system_one_batch", batch) == (False, expected)
            for tool, path in (
                ("list_models", "/v1/models"),
                ("unload_models", "/v1/models/unload"),
            ):
                status, expected = await _http(api, path)
                assert await _tool(client, tool, {}) == (False, expected)
    finally:
        await service.close()
    # the fake TypeSafe's answers depend on the request: equal answers are no coincidence
    assert answers[0]["queue"]["probabilities"] != {"billing": 0.5, "technical": 0.5}


async def test_forwarding_to_nothing_is_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    backend = ForwardingBackend(url, API_KEY, httpx.Timeout(5))
    try:
        with pytest.raises(ToolFailure) as failure:
            await backend.call("system_one", REQUESTS[0])
    finally:
        await backend.close()
    assert failure.value.status == 503
    assert failure.value.envelope == {
        "code": "PROVIDER_UNAVAILABLE",
        "message": "the Decidealot server is unreachable",
        "details": {},
    }


def test_stdio_rejects_a_url_with_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--url", "http://user:secret@127.0.0.1:8080"])
    assert exited.value.code == 2
    assert "secret" not in capsys.readouterr().err
