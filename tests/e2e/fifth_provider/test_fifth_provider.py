"""A fifth provider, added through its descriptor alone, serves decisions over HTTP and MCP.

The provider is this folder: its descriptor (settings, bundle and the file it must hold,
selectors, lane, how it is built), its gateway side (a `CheckpointProvider`) and its worker
engine. It is registered the way another distribution would register one: metadata naming
the descriptor in the `decidealot.providers` entry-point group, on the path of the real
`decidealot serve` and `decidealot mcp`. No module of the package knows about it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cli import NO_LOCAL, run_cli
from tests.support.mcp_clients import over_stdio
from tests.support.servers import RunningServer, start_server

WEIGHT = 0.8
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is this a refund request?"},
    "queue": {"type": "choice", "criteria": {"billing": "Payments", "tech": "Software"}},
}
DECISION = {"model": "fifth", "state": "I was charged twice.", "questions": QUESTIONS}


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment that registers the fifth provider and names its checkpoint."""
    site = tmp_path_factory.mktemp("site")
    info = site / "decidealot_fifth-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: decidealot-fifth\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[decidealot.providers]\nfifth = tests.e2e.fifth_provider.descriptor:DESCRIPTOR\n"
    )
    checkpoint = site / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "weights.json").write_text(json.dumps({"weight": WEIGHT}))
    path = os.pathsep.join([str(site), os.environ["PYTHONPATH"]])
    return NO_LOCAL | {"PYTHONPATH": path, "DECIDEALOT_FIFTH_CHECKPOINT": str(checkpoint)}


@pytest.fixture(scope="module")
def served(
    registered: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("fifth")
    server = start_server(folder, launcher="decidealot", args=("serve",), **registered)
    yield server
    assert server.stop() == 0


def _assert_answered(body: dict[str, object]) -> None:
    assert body["model"] == "fifth-1"
    answers = body["answers"]
    assert answers["refund"] == {"type": "noul", "noul": WEIGHT}  # type: ignore[index]
    assert answers["queue"]["choice"] == "billing"  # type: ignore[index]
    assert answers["queue"]["probabilities"] == pytest.approx(  # type: ignore[index]
        {"billing": WEIGHT, "tech": 1 - WEIGHT}
    )
    assert body["usage"] == {"input_tokens": 16, "output_tokens": 0}


def test_it_serves_decisions_over_http_from_a_real_worker(served: RunningServer) -> None:
    assert httpx.get(f"{served.url}/health").json()["providers"] == ["fifth"]
    names = [m["name"] for m in httpx.get(f"{served.url}/v1/models").json()["models"]]
    assert names == ["fifth", "fifth-latest"]
    schema = httpx.get(f"{served.url}/openapi.json").json()["components"]["schemas"]
    assert "fifth-latest" in json.dumps(schema)
    answered = httpx.post(f"{served.url}/v1/systemone", json=DECISION, timeout=60)
    assert answered.status_code == 200, answered.text
    _assert_answered(answered.json())
    batch = {"requests": [DECISION, DECISION | {"model": "fifth-latest"}]}
    assert httpx.post(f"{served.url}/v1/systemone/batch", json=batch, timeout=60).status_code == 200
    refused = httpx.post(
        f"{served.url}/v1/systemone",
        json=DECISION | {"questions": {"level": {"type": "score", "criteria": ["lo", "hi"]}}},
    )
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "questions", "level"]
    unloaded = httpx.post(f"{served.url}/v1/models/unload", timeout=60).json()
    assert unloaded == {"status": "unloaded", "providers": [{"name": "fifth", "wasLoaded": True}]}


async def test_it_serves_decisions_over_mcp(registered: dict[str, str]) -> None:
    async with over_stdio([], registered) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert {"system_one", "list_models"} <= tools
        result = await client.call_tool("system_one", DECISION)
        assert not result.is_error, result.content
        _assert_answered(result.structured_content)  # type: ignore[arg-type]


def test_its_settings_are_strict_and_its_checkpoint_is_checked(
    registered: dict[str, str], tmp_path: Path
) -> None:
    listed = run_cli("models", **registered)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == [
        "fifth",
        "fifth-latest",
    ]
    typo = run_cli("models", **registered, DECIDEALOT_FIFTH_CHEKPOINT="x")
    assert typo.returncode == 2
    assert typo.stderr.strip().endswith("the closest one is DECIDEALOT_FIFTH_CHECKPOINT")
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = run_cli("prepare", **registered | {"DECIDEALOT_FIFTH_CHECKPOINT": str(empty)})
    assert missing.returncode == 1
    assert f"DECIDEALOT_FIFTH_CHECKPOINT={empty}: weights.json is missing" in missing.stderr
