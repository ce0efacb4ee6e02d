"""MCP at `/mcp` of the app in-process (the quick loop's share of tests/e2e/test_mcp*.py): the
tools answer what the HTTP API answers, bad arguments get the same 422 envelope as a tool error,
and tool arguments pass the HTTP API's strict JSON first."""

from __future__ import annotations

import json
from typing import Any

from tests.support.app import GATEWAY, InProcessApp, app_fixture
from tests.support.mcp_clients import in_tool_terms, tool_outcome

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
DECISION: dict[str, Any] = {
    "model": "von",
    "state": {"ticket": "refund"},
    "questions": {"review": {"type": "noul", "instructions": "Is human review needed?"}},
}

gateway = app_fixture("gateway", **GATEWAY, DECIDEALOT_MCP_ALLOWED_HOSTS="testserver.local")


def rpc(app: InProcessApp, method: str, params: dict[str, Any], raw: bytes | None = None) -> Any:
    body = raw or json.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
    response = app.client.post("/mcp", content=body, headers=HEADERS)
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return next(m for m in map(json.loads, data) if m.get("id") == 7)["result"]


def test_tools_are_listed_with_their_schemas(gateway: InProcessApp) -> None:
    tools = {tool["name"]: tool for tool in rpc(gateway, "tools/list", {})["tools"]}
    assert set(tools) == {"system_one", "system_one_batch", "list_models", "unload_models"}
    assert "questions" in tools["system_one"]["inputSchema"]["properties"]


def test_a_decision_equals_the_http_answer(gateway: InProcessApp) -> None:
    result = rpc(gateway, "tools/call", {"name": "system_one", "arguments": DECISION})
    http = gateway.client.post("/v1/systemone", json=DECISION)
    assert tool_outcome(result) == (False, http.json())


def test_a_bad_call_is_the_http_apis_422_as_a_tool_error(gateway: InProcessApp) -> None:
    arguments = DECISION | {"model": "no-such-model"}
    result = rpc(gateway, "tools/call", {"name": "system_one", "arguments": arguments})
    http = gateway.client.post("/v1/systemone", json=arguments)
    assert http.status_code == 422
    assert tool_outcome(result) == (True, in_tool_terms(http.json()))
    assert "list_models" in json.loads(result["content"][0]["text"])["detail"][0]["msg"]


def test_arguments_pass_the_strict_json_parser(gateway: InProcessApp) -> None:
    raw = (
        b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "system_one",'
        b' "arguments": {"model": "von", "model": "von", "state": "s", "questions": {}}}}'
    )
    result = rpc(gateway, "tools/call", {}, raw=raw)
    assert result["isError"] is True
    (issue,) = json.loads(result["content"][0]["text"])["detail"]
    assert issue["type"] == "json_invalid" and "duplicate object key 'model'" in issue["msg"]


def test_the_model_enum_lists_the_names_now(gateway: InProcessApp) -> None:
    tools = {tool["name"]: tool for tool in rpc(gateway, "tools/list", {})["tools"]}
    names = [m["name"] for m in gateway.client.get("/v1/models").json()["models"]]
    assert tools["system_one"]["inputSchema"]["properties"]["model"]["enum"] == names


def test_bodies_that_are_not_one_message_get_json_rpc_errors(gateway: InProcessApp) -> None:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    modern = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": meta}}
    for body, headers, code in (
        (b"{", {}, -32700),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', {}, -32600),
        (json.dumps(modern).encode(), {"MCP-Protocol-Version": "2025-06-18"}, -32020),
        (b'{"jsonrpc": "2.0", "id": 4, "method": "ping"}', {"MCP-Protocol-Version": "1"}, -32022),
    ):
        response = gateway.client.post("/mcp", content=body, headers=HEADERS | headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == code, response.text
