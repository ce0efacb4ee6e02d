"""The HTTP surface over real HTTP: health, request ids, auth, errors, models, unload, framing."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import zstandard

from decidealot import registry
from decidealot.asgi.middleware import Gateway
from decidealot.service import Service
from tests.support.servers import ALL_FAKES, RunningServer, health_once_signalled, wait_until

REQUEST = {"model": "von", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}
ERROR_KEYS = {"code", "message", "details"}


@pytest.mark.smoke
def test_health_lists_configured_providers(gateway: RunningServer) -> None:
    response = httpx.get(gateway.url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "providers": ["laya", "von", "clm", "jev"]}


@pytest.mark.parametrize(
    ("env", "providers"),
    [
        ({}, ["laya", "von"]),
        ({"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_VON_ENABLED": "false",
          "DECIDEALOT_CLM_EMBEDDINGS_URL": "http://127.0.0.1:9/v1"}, ["clm"]),
    ],
    ids=["default", "clm-only"],
)  # fmt: skip
def test_health_of_other_deployments(
    launch: Callable[..., RunningServer], env: dict[str, str], providers: list[str]
) -> None:
    server = launch(**env)
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "providers": providers}
    names = [m["name"] for m in httpx.get(server.url + "/v1/models").json()["models"]]
    assert {n.split("-")[0] for n in names} == set(providers)


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/health"), ("GET", "/nope"), ("POST", "/v1/systemone")]
)
def test_request_id_on_every_response(gateway: RunningServer, method: str, path: str) -> None:
    generated = httpx.request(method, gateway.url + path, content=b"{")
    assert str(uuid.UUID(generated.headers["x-request-id"])) == generated.headers["x-request-id"]
    assert generated.headers["x-typesafe-request-id"] == generated.headers["x-request-id"]
    for sent in (str(uuid.uuid4()), "01ARZ3NDEKTSV4RRFFQ69G5FAV"):
        echoed = httpx.request(method, gateway.url + path, headers={"x-request-id": sent})
        assert echoed.headers["x-request-id"] == sent
    invalid = httpx.request(method, gateway.url + path, headers={"x-request-id": "not-an-id\t1"})
    assert uuid.UUID(invalid.headers["x-request-id"])


def test_log_lines_carry_the_request_id(gateway: RunningServer) -> None:
    sent = str(uuid.uuid4())
    httpx.post(gateway.url + "/v1/systemone", json=REQUEST, headers={"x-request-id": sent})

    def logged() -> bool:  # the access line is written after the answer
        lines = [json.loads(line) for line in gateway.log_lines() if line.startswith("{")]
        return any(
            line["request_id"] == sent and "/v1/systemone" in line["message"] for line in lines
        )

    wait_until(logged, "a log line with the request id")


def test_not_found_uses_the_error_envelope(gateway: RunningServer) -> None:
    response = httpx.get(gateway.url + "/v2/anything")
    assert response.status_code == 404
    assert set(response.json()) == ERROR_KEYS
    assert response.json()["code"] == "NOT_FOUND"
    wrong_method = httpx.get(gateway.url + "/v1/systemone")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["code"] == "METHOD_NOT_ALLOWED"


def test_models_lists_every_selector_once(gateway: RunningServer) -> None:
    models = httpx.get(gateway.url + "/v1/models").json()["models"]
    names = [m["name"] for m in models]
    assert names == [
        "laya", "laya-auto", "laya-latest", "laya-english", "laya-multilingual",
        "laya-typed-decisions", "von", "von-latest", "von-1.1", "von-1.1.0",
        "clm", "clm-latest", "clm-0.1", "clm-0.1-8b", "jev-latest", "jev-1.13.0",
    ]  # fmt: skip
    assert all(set(m) == {"name", "description", "release_date"} for m in models)
    # the hosted catalog also lists "von": the local selector wins and stays local
    assert httpx.post(gateway.url + "/v1/systemone", json=REQUEST).json()["model"] == "von-1.1"


def test_model_names_the_model_that_answered(gateway: RunningServer) -> None:
    for selector, answered in [("laya-auto", "laya-english"), ("von-1.1.0", "von-1.1"),
                               ("jev-1.13.0", "jev-1.13.0")]:  # fmt: skip
        response = httpx.post(gateway.url + "/v1/systemone", json={**REQUEST, "model": selector})
        assert response.status_code == 200
        assert response.json() == {
            "model": answered,
            "answers": {"q": {"type": "noul", "noul": 0.5}},
            "usage": {"input_tokens": 10, "output_tokens": 0},
        }


@pytest.mark.smoke
def test_answers_have_the_contract_shapes(gateway: RunningServer) -> None:
    questions = {
        "route": {"type": "choice", "criteria": {"standard": "a", "review": "b"}},
        "urgency": {"type": "score", "criteria": ["routine", "important", "urgent"]},
        "can_run": {"type": "noul", "criteria": {"true": "t", "false": "f"}},
    }
    response = httpx.post(gateway.url + "/v1/systemone", json={**REQUEST, "questions": questions})
    answers = response.json()["answers"]
    assert list(answers) == ["route", "urgency", "can_run"]
    assert answers["route"]["type"] == "choice"
    assert set(answers["route"]["probabilities"]) == {"standard", "review"}
    assert answers["urgency"]["legend"] == {"0": "routine", "1": "important", "2": "urgent"}
    assert set(answers["urgency"]["probabilities"]) == {"0", "1", "2"}
    assert answers["can_run"] == {"type": "noul", "noul": 0.5}


def test_hosted_catalog_outage(gateway: RunningServer) -> None:
    gateway.jev_catalog.write_text('"fail"')
    try:
        listing = httpx.get(gateway.url + "/v1/models")
        assert listing.status_code == 503
        assert listing.json()["code"] == "PROVIDER_UNAVAILABLE"
        hosted = httpx.post(gateway.url + "/v1/systemone", json={**REQUEST, "model": "jev-latest"})
        assert hosted.status_code == 503
        local = httpx.post(gateway.url + "/v1/systemone", json=REQUEST)
        assert local.status_code == 200
        invalid_anyway = {**REQUEST, "model": "jev-latest", "state": 1}
        rejected = httpx.post(gateway.url + "/v1/systemone", json=invalid_anyway)
        assert rejected.status_code == 422
        assert [i["loc"] for i in rejected.json()["detail"]] == [["body", "state"]]
    finally:
        gateway.jev_catalog.write_text(json.dumps(["jev-latest", "jev-1.13.0", "von"]))


@pytest.mark.parametrize(
    ("fail", "status", "code"),
    [("unavailable", 503, "PROVIDER_UNAVAILABLE"), ("crash", 503, "PROVIDER_UNAVAILABLE"),
     ("bad_answer", 503, "PROVIDER_UNAVAILABLE")],
)  # fmt: skip
def test_provider_failures_are_safe_503s(
    gateway: RunningServer, fail: str, status: int, code: str
) -> None:
    payload = {**REQUEST, "state": {"fake": {"fail": fail}, "note": "TOPSECRET-4711"}}
    response = httpx.post(gateway.url + "/v1/systemone", json=payload)
    assert response.status_code == status
    assert response.json() == {
        "code": code,
        "message": "the selected provider is unavailable",
        "details": {},
    }
    assert "TOPSECRET-4711" not in gateway.log_file.read_text()


def test_provider_input_error_is_a_422_at_the_question(gateway: RunningServer) -> None:
    payload = {**REQUEST, "state": {"fake": {"fail": "input"}}}
    response = httpx.post(gateway.url + "/v1/systemone", json=payload)
    assert response.status_code == 422
    assert response.json()["detail"] == [
        {
            "loc": ["body", "questions", "q", "criteria"],
            "msg": "Value error, too long for this model",
            "type": "value_error",
            "input": 7,
        }
    ]


async def test_unexpected_errors_are_a_safe_500() -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("secret state contents")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    app = Gateway(broken, Service(registry.settings(), providers=[]))
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": []}
    await app(scope, None, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"]) == {
        "code": "INTERNAL_ERROR",
        "message": "the request could not be completed",
        "details": {},
    }
    assert b"secret" not in sent[1]["body"]


# -- authentication ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.servers import start_server

    server = start_server(tmp_path_factory.mktemp("secured"), DECIDEALOT_API_KEY="k3y-Secret")
    yield server
    assert server.stop() == 0


UNAUTHORIZED = {
    "code": "UNAUTHORIZED",
    "message": "a valid bearer token is required",
    "details": {},
}


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/status"), ("GET", "/v1/models"), ("POST", "/v1/systemone"),
     ("POST", "/v1/systemone/batch"), ("POST", "/v1/models/unload"), ("GET", "/docs/x"),
     ("POST", "/mcp"), ("GET", "/nope")],
)  # fmt: skip
def test_every_route_but_health_and_docs_needs_the_key(
    secured: RunningServer, method: str, path: str
) -> None:
    wrong = ["Bearer wrong", "k3y-Secret", "Basic k3y-Secret", "Bearer k3y-Secre", "Bearer"]
    for headers in [{}, *({"authorization": value} for value in wrong)]:
        response = httpx.request(method, secured.url + path, headers=headers, json=REQUEST)
        assert response.status_code == 401, (headers, response.text)
        assert response.json() == UNAUTHORIZED
        assert response.headers["x-request-id"]
    assert "k3y-Secret" not in secured.log_file.read_text()


def test_the_key_opens_every_route(secured: RunningServer) -> None:
    auth = {"authorization": "Bearer k3y-Secret"}
    assert httpx.get(secured.url + "/health").status_code == 200
    assert httpx.get(secured.url + "/v1/models", headers=auth).status_code == 200
    decided = httpx.post(secured.url + "/v1/systemone", json=REQUEST, headers=auth)
    assert decided.status_code == 200
    schema = httpx.get(secured.url + "/openapi.json", headers=auth).json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "401" in schema["paths"]["/v1/systemone"]["post"]["responses"]


# -- unload ----------------------------------------------------------------------------------


def test_unload_reports_every_local_provider(launch: Callable[..., RunningServer]) -> None:
    server = launch(**ALL_FAKES, DECIDEALOT_MAX_RESIDENT_PROVIDERS="2")
    first = httpx.post(server.url + "/v1/models/unload")
    assert first.status_code == 200
    assert first.json() == {
        "status": "unloaded",
        "providers": [{"name": n, "wasLoaded": False} for n in ("laya", "von", "clm")],
    }
    httpx.post(server.url + "/v1/systemone", json={**REQUEST, "model": "laya"})
    report = httpx.post(server.url + "/v1/models/unload").json()["providers"]
    assert report == [
        {"name": "laya", "wasLoaded": True},
        {"name": "von", "wasLoaded": False},
        {"name": "clm", "wasLoaded": False},
    ]
    again = httpx.post(server.url + "/v1/models/unload").json()["providers"]
    assert all(not p["wasLoaded"] for p in again)


def test_unload_is_refused_while_a_local_decision_runs(
    launch: Callable[..., RunningServer],
) -> None:
    server = launch(**ALL_FAKES)
    slow_local = {**REQUEST, "state": {"fake": {"sleep": 1.0, "tag": "local"}}}
    hosted_state = {"fake": {"sleep": 1.5, "tag": "hosted"}}
    slow_hosted = {**REQUEST, "model": "jev-latest", "state": hosted_state}
    with httpx.Client(base_url=server.url, timeout=10) as client:
        warm = client.post("/v1/systemone", json=REQUEST)
        assert warm.status_code == 200

        def background(payload: dict[str, Any]) -> threading.Thread:
            thread = threading.Thread(target=httpx.post, args=(server.url + "/v1/systemone",),
                                      kwargs={"json": payload, "timeout": 10})  # fmt: skip
            thread.start()
            return thread

        hosted = background(slow_hosted)
        local = background(slow_local)
        wait_until(lambda: {"local", "hosted"} <= set(server.begun()), "both decisions began")
        busy = client.post("/v1/models/unload")
        assert busy.status_code == 409
        assert busy.json()["code"] == "PROVIDER_BUSY"
        local.join()
        # von is still loaded: the refused unload released nothing; the hosted call is running
        report = client.post("/v1/models/unload")
        assert report.status_code == 200
        assert {"name": "von", "wasLoaded": True} in report.json()["providers"]
        hosted.join()


# -- framing -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.servers import start_server

    server = start_server(tmp_path_factory.mktemp("small"), DECIDEALOT_MAX_REQUEST_BYTES="4096")
    yield server
    assert server.stop() == 0


def big_request(size: int) -> bytes:
    return json.dumps({**REQUEST, "state": "x" * size}).encode()


def test_body_limit_with_content_length(small: RunningServer) -> None:
    ok = httpx.post(small.url + "/v1/systemone", content=big_request(3000),
                    headers={"content-type": "application/json"})  # fmt: skip
    assert ok.status_code == 200
    response = httpx.post(small.url + "/v1/systemone", content=big_request(5000))
    assert response.status_code == 413
    assert response.json()["code"] == "REQUEST_TOO_LARGE"


def test_body_limit_with_chunked_upload(small: RunningServer) -> None:
    def chunks() -> Any:
        payload = big_request(20000)
        for start in range(0, len(payload), 1000):
            yield payload[start : start + 1000]

    response = httpx.post(small.url + "/v1/systemone", content=chunks())
    assert response.status_code == 413


def _raw_exchange(url: str, head: bytes, feed: Callable[[socket.socket], None]) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        with contextlib.suppress(OSError):  # the server may close once it has answered
            feed(sock)
        sock.settimeout(10)
        return sock.recv(65536)


def test_a_gigabyte_upload_is_refused_without_reading_it(small: RunningServer) -> None:
    head = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n")  # fmt: skip
    # the answer to a gigabyte of which 64 KiB were sent: the server did not wait for the rest
    reply = _raw_exchange(small.url, head, lambda sock: sock.sendall(b"{" * 65536))
    assert reply.startswith(b"HTTP/1.1 413")


def test_an_endless_chunked_upload_is_cut_off(small: RunningServer) -> None:
    head = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip

    def feed(sock: socket.socket) -> None:
        for _ in range(100):  # 1.6 MB offered, limit 4 KiB
            sock.sendall(b"4000\r\n" + b" " * 0x4000 + b"\r\n")

    assert _raw_exchange(small.url, head, feed).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_compressed_bodies_are_decoded(small: RunningServer, encoding: str) -> None:
    raw = big_request(3000)
    data = zstandard.compress(raw) if encoding == "zstd" else gzip.compress(raw)
    response = httpx.post(small.url + "/v1/systemone", content=data,
                          headers={"content-encoding": encoding,
                                   "content-type": "application/json"})  # fmt: skip
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_the_limit_applies_to_decoded_bytes(small: RunningServer, encoding: str) -> None:
    bomb_source = big_request(50_000_000)  # 50 MB of state compresses to a few KiB
    data = (zstandard.ZstdCompressor(level=19).compress(bomb_source) if encoding == "zstd"
            else gzip.compress(bomb_source, 9))  # fmt: skip
    assert len(data) < 4096 * 20
    if len(data) > 4096:
        data = (zstandard.compress(big_request(500_000)) if encoding == "zstd"
                else gzip.compress(big_request(500_000), 9))  # fmt: skip
    assert len(data) <= 4096
    response = httpx.post(small.url + "/v1/systemone", content=data,
                          headers={"content-encoding": encoding})  # fmt: skip
    assert response.status_code == 413
    assert response.json()["code"] == "REQUEST_TOO_LARGE"


def _streamed_zstd(data: bytes, window_log: int) -> bytes:
    """A frame as a streaming compressor writes it: no content size, the window it was given."""
    params = zstandard.ZstdCompressionParameters(window_log=window_log, write_content_size=False)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    return compressor.compress(data) + compressor.flush()


def test_zstd_windows_are_bounded_by_the_body_limit(small: RunningServer) -> None:
    """A 128 MiB window (zstd's default ceiling) around a tiny body is refused before any
    decoding; a window within the 4 KiB limit decodes."""
    huge = _streamed_zstd(big_request(10), 27)
    assert zstandard.get_frame_parameters(huge).window_size == 1 << 27
    refused = httpx.post(small.url + "/v1/systemone", content=huge,
                         headers={"content-encoding": "zstd"})  # fmt: skip
    assert refused.status_code == 413, refused.text
    assert refused.json()["code"] == "REQUEST_TOO_LARGE"
    assert "window over 4096 bytes" in refused.json()["message"]
    fits = httpx.post(small.url + "/v1/systemone", content=_streamed_zstd(big_request(10), 12),
                      headers={"content-encoding": "zstd"})  # fmt: skip
    assert fits.status_code == 200, fits.text


def test_corrupt_and_unknown_encodings(small: RunningServer) -> None:
    corrupt = httpx.post(small.url + "/v1/systemone", content=b"not zstd at all",
                         headers={"content-encoding": "zstd"})  # fmt: skip
    assert corrupt.status_code == 400
    assert corrupt.json()["code"] == "MALFORMED_BODY"
    for encoding in ("br", "deflate", "gzip, zstd"):
        response = httpx.post(small.url + "/v1/systemone", content=b"{}",
                              headers={"content-encoding": encoding})  # fmt: skip
        assert response.status_code == 415
        assert response.json()["code"] == "UNSUPPORTED_CONTENT_ENCODING"
        assert "gzip" in response.json()["message"]


def test_media_types(small: RunningServer) -> None:
    url = small.url + "/v1/systemone"
    raw = json.dumps(REQUEST).encode()
    assert httpx.post(url, content=raw).status_code == 200  # no Content-Type: read as JSON
    for media_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert httpx.post(url, content=raw, headers={"content-type": media_type}).status_code == 200
    form = httpx.post(url, data={"model": "von"})
    assert form.status_code == 415
    assert form.json()["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert "Content-Type: application/json" in form.json()["message"]
    # curl -d / --data-binary send the form type; a JSON body under it is read as JSON
    curl = {"content-type": "application/x-www-form-urlencoded"}
    assert httpx.post(url, content=b" \n" + raw, headers=curl).status_code == 200
    gzipped = httpx.post(url, content=gzip.compress(raw),
                         headers=curl | {"content-encoding": "gzip"})  # fmt: skip
    assert gzipped.status_code == 200
    invalid = httpx.post(url, content=b'{"model": ', headers=curl)
    assert invalid.status_code == 422  # JSON-shaped: judged as JSON, naming where it breaks
    assert invalid.json()["detail"][0]["type"] == "json_invalid"
    multipart = httpx.post(url, files={"asset-0": ("asset-0", b"\x89PNG", "image/png")},
                           data={"request": raw.decode()})  # fmt: skip
    assert multipart.status_code == 415
    assert "image assets" in multipart.json()["message"]


# -- OpenAPI -------------------------------------------------------------------------------


def test_openapi_describes_every_route(gateway: RunningServer) -> None:
    schema = httpx.get(gateway.url + "/openapi.json").json()
    paths = schema["paths"]
    assert set(paths) == {"/health", "/v1/status", "/v1/models", "/v1/systemone",
                          "/v1/systemone/batch", "/v1/models/unload", "/mcp"}  # fmt: skip
    for path in ("/v1/systemone", "/v1/systemone/batch"):
        responses = paths[path]["post"]["responses"]
        assert {"200", "413", "422", "503"} <= set(responses)
        assert "RFC 8941" in responses["200"]["headers"]["Decidealot-Truncated"]["description"]
    assert "409" in paths["/v1/models/unload"]["post"]["responses"]
    assert "503" in paths["/health"]["get"]["responses"]
    components = schema["components"]["schemas"]
    assert components["ScoreQuestion"]["properties"]["criteria"]["maxItems"] == 10
    assert components["BatchRequest"]["properties"]["requests"]["maxItems"] == 8
    assert "401" not in paths["/v1/models"]["get"]["responses"]  # no key on this server
    assert httpx.get(gateway.url + "/docs").headers["content-type"].startswith("text/html")


# -- shutdown --------------------------------------------------------------------------------


def test_sigterm_drains_then_exits_zero(launch: Callable[..., RunningServer]) -> None:
    server = launch()
    outcome: dict[str, httpx.Response] = {}

    def slow() -> None:
        payload = {**REQUEST, "state": {"fake": {"sleep": 1.5, "tag": "slow"}}}
        outcome["slow"] = httpx.post(server.url + "/v1/systemone", json=payload, timeout=10)

    with httpx.Client(base_url=server.url) as client:
        assert client.get("/health").status_code == 200  # keep-alive connection for later
        thread = threading.Thread(target=slow)
        thread.start()
        wait_until(lambda: "slow" in server.begun(), "the slow decision began")
        server.process.terminate()
        health = health_once_signalled(client)
        assert health.status_code == 503
        assert health.json()["code"] == "PROVIDER_UNAVAILABLE"
        refused = client.post("/v1/systemone", json=REQUEST)
        assert refused.status_code == 503
        thread.join()
    assert outcome["slow"].status_code == 200
    assert server.process.wait(20) == 0


def test_a_stalled_body_times_out(launch: Callable[..., RunningServer]) -> None:
    server = launch(DECIDEALOT_REQUEST_READ_TIMEOUT_SECONDS="0.5")
    head = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"model\":")  # fmt: skip
    # 408 after the 0.5 s set, within _raw_exchange's 10 s (the default would be 30 s)
    reply = _raw_exchange(server.url, head, lambda sock: None)
    assert reply.startswith(b"HTTP/1.1 408")
    assert b"REQUEST_TIMEOUT" in reply
