"""Secrets the way containers pass them, over the real `decidealot serve`: every secret setting
read from the file its `_FILE` twin names (DECIDEALOT_API_KEY with two keys, one per line, for a
rotation; the CLM embeddings key and the TypeSafe key reaching their upstreams), the access line
naming which key authenticated each request by a short id and never a key, and the startup
refusals over the real command (the rest of them: tests/unit/test_strict_settings.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from decidealot.providers.clm.tiny import build_clm_head
from tests.support.cli import NO_LOCAL, run_cli
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.fake_typesafe import FakeTypeSafe, serve
from tests.support.servers import RunningServer, start_server

OLD, NEW = "old-key-3f9a", "new-key-77c1"
CLM_KEY, TYPESAFE_KEY = "clm-key-b2d0", "typesafe-key-e5a4"
NOUL = {"review": {"type": "noul", "instructions": "Needs a human?"}}


def key_id(key: str) -> str:
    """As docs/operations.md computes it: `printf %s "$KEY" | sha256sum | cut -c1-8`."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


@pytest.fixture(scope="module")
def embeddings() -> Iterator[FakeEmbeddings]:
    fake = FakeEmbeddings(4096).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def typesafe() -> Iterator[FakeTypeSafe]:
    with serve(FakeTypeSafe(TYPESAFE_KEY)) as fake:
        yield fake


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, embeddings: FakeEmbeddings, typesafe: FakeTypeSafe
) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("secrets")
    secrets = folder / "secrets"
    secrets.mkdir()
    (secrets / "api-keys").write_text(f"{OLD}\n{NEW}\n")  # as a mounted Secret: one per line
    (secrets / "clm").write_text(CLM_KEY + "\n")
    (secrets / "typesafe").write_text(TYPESAFE_KEY)
    head = build_clm_head(folder / "head.pt", hidden=4096, width=8, proj=4, seed=3)
    server = start_server(
        folder,
        launcher="decidealot",
        args=("serve",),
        **NO_LOCAL,
        DECIDEALOT_API_KEY_FILE=str(secrets / "api-keys"),
        DECIDEALOT_CLM_EMBEDDINGS_URL=embeddings.url,
        DECIDEALOT_CLM_EMBEDDINGS_API_KEY_FILE=str(secrets / "clm"),
        DECIDEALOT_CLM_HEAD=str(head),
        DECIDEALOT_TYPESAFE_API_KEY_FILE=str(secrets / "typesafe"),
        DECIDEALOT_TYPESAFE_BASE_URL=typesafe.url,
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
    )
    yield server
    assert server.stop() == 0


def decide(server: RunningServer, model: str, key: str) -> httpx.Response:
    body = {"model": model, "state": "a refund, charged twice", "questions": NOUL}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(server.url + "/v1/systemone", json=body, headers=headers, timeout=60)


def test_either_key_of_a_rotation_opens_the_routes(server: RunningServer) -> None:
    for key in (OLD, NEW):
        models = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert models.status_code == 200, models.text
    for wrong in (f"{OLD},{NEW}", f"{OLD} {NEW}", OLD[:-1], "other"):
        refused = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {wrong}"})
        assert refused.status_code == 401


def test_the_providers_keys_reach_their_upstreams(
    server: RunningServer, embeddings: FakeEmbeddings
) -> None:
    embeddings.auth_headers.clear()
    clm = decide(server, "clm", NEW)
    assert clm.status_code == 200, clm.text
    assert set(embeddings.auth_headers) == {f"Bearer {CLM_KEY}"}
    jev = decide(server, "jev-latest", OLD)  # the fake TypeSafe refuses any other key
    assert jev.status_code == 200, jev.text


def test_the_access_line_names_the_key_by_its_id_never_the_key(server: RunningServer) -> None:
    httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {OLD}"})
    httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {NEW}"})
    httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer nope"})
    httpx.get(server.url + "/health")
    lines = [line for line in server.log_lines() if "GET /v1/models" in line]
    assert any("GET /v1/models 200" in line and f"ms key {key_id(OLD)}" in line for line in lines)
    assert any("GET /v1/models 200" in line and f"ms key {key_id(NEW)}" in line for line in lines)
    assert any("GET /v1/models 401" in line and "ms key" not in line for line in lines)
    log = server.log_file.read_text()
    for secret in (OLD, NEW, CLM_KEY, TYPESAFE_KEY):
        assert secret not in log


def test_a_key_set_twice_stops_serve_naming_both(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("from-a-file")
    result = run_cli(
        "serve",
        **NO_LOCAL,
        DECIDEALOT_TYPESAFE_API_KEY="in-the-environment",
        DECIDEALOT_TYPESAFE_API_KEY_FILE=str(tmp_path / "key"),
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "decidealot: DECIDEALOT_TYPESAFE_API_KEY and DECIDEALOT_TYPESAFE_API_KEY_FILE are both "
        "set: set one of them"
    ]


def test_a_key_file_serve_cannot_read_stops_it_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "missing"
    result = run_cli("serve", **NO_LOCAL, DECIDEALOT_API_KEY_FILE=str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"decidealot: DECIDEALOT_API_KEY_FILE: cannot read {str(path)!r}: No such file or directory"
    ]
