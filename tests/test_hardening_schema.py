"""Schemathesis against the served OpenAPI document: generated valid and invalid requests for
every operation, over real HTTP. No response may be a 5xx, every response must match the status
codes, media type and body schema the document declares for it, and schema-invalid requests
must be rejected (4xx).

The document types `model` as a string, so almost every generated decision would be an
unknown model (422). Positive cases therefore get a catalog name instead, drawn from the
generated string, so the providers (the fakes of tests/test_providers.py) answer too.

Cases come from each operation's hypothesis strategy rather than schemathesis' pytest plugin,
whose lazy fixture loader does not run under pytest 9.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from decidealot.config import Settings
from decidealot.http import openapi
from tests.conftest import RunningServer, start_server

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 20}
KEY = "schema-key-Wd4Ns8"
_PATHS = openapi.build(Settings())["paths"]
OPERATIONS = [(method.upper(), path) for path, methods in _PATHS.items() for method in methods]
CASES = [
    (method, path, mode)
    for method, path in OPERATIONS
    for mode in EXAMPLES
    # negative cases need an input to break; operations without one have none
    if mode == GenerationMode.POSITIVE or "requestBody" in _PATHS[path][method.lower()]
]


@pytest.fixture(scope="module")
def catalog(gateway: RunningServer) -> list[str]:
    return [model["name"] for model in httpx.get(gateway.url + "/v1/models").json()["models"]]


@pytest.fixture(scope="module")
def served_schema(gateway: RunningServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(gateway.url + "/openapi.json")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("secured"), DECIDEALOT_API_KEY=KEY)
    yield server
    assert server.stop() == 0


def with_catalog_models(case: schemathesis.Case, catalog: list[str]) -> None:
    body = case.body
    items = body.get("requests") if isinstance(body, dict) else None
    for request in items if isinstance(items, list) else [body]:
        if isinstance(request, dict) and isinstance(request.get("model"), str):
            pick = zlib.crc32(request["model"].encode("utf-8", "surrogatepass"))
            request["model"] = catalog[pick % len(catalog)]


def test_every_operation_is_covered(served_schema: schemathesis.BaseSchema) -> None:
    served = {(op.ok().method.upper(), op.ok().path) for op in served_schema.get_all_operations()}
    assert served == set(OPERATIONS)


@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m}-{p}-{g.value}" for m, p, g in CASES]
)
def test_responses_match_the_served_schema(
    served_schema: schemathesis.BaseSchema,
    catalog: list[str],
    method: str,
    path: str,
    mode: GenerationMode,
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
        if mode == GenerationMode.POSITIVE:
            with_catalog_models(case, catalog)
        case.call_and_validate(checks=CHECKS, timeout=10)

    check()


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_a_secured_server_matches_its_schema_with_and_without_the_key(
    secured: RunningServer, method: str, path: str
) -> None:
    """With DECIDEALOT_API_KEY the document declares bearer security and 401s; every response,
    refused or not, must match it."""
    schema = schemathesis.openapi.from_url(
        secured.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}
    )
    operation = schema[path][method]

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(max_examples=8, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def check(case: schemathesis.Case) -> None:
        refused = case.call_and_validate(checks=CHECKS, timeout=10)
        assert refused.status_code == (200 if path == "/health" else 401)
        case.call_and_validate(
            checks=CHECKS, timeout=10, headers={"Authorization": f"Bearer {KEY}"}
        )

    check()
