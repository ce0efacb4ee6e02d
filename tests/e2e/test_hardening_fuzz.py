"""Hostile bodies over real HTTP: malformed JSON, huge numbers, deep nesting, lone surrogates
and invalid UTF-8. Each gets a 4xx in one of the two error envelopes, quickly (no hang), and
the server keeps serving. Local decisions are also tried on real worker subprocesses
(tests/ops_server), where a value that reached the worker unchecked would show as a 503.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import ops_launcher as ops_server
from tests.support.servers import RunningServer

TIMEOUT = httpx.Timeout(10.0)
ROUTES = ("/v1/systemone", "/v1/systemone/batch")
VALID = {"model": "laya", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def envelope_ok(response: httpx.Response) -> bool:
    """A 4xx in the TypeSafe 422 envelope or Decidealot's error envelope, with a request id."""
    if not 400 <= response.status_code < 500 or "x-request-id" not in response.headers:
        return False
    body = response.json()
    if response.status_code == 422:
        return set(body) == {"detail"} and all(
            set(issue) == {"loc", "msg", "type", "input"} and issue["loc"][0] == "body"
            for issue in body["detail"]
        )
    return set(body) == {"code", "message", "details"}


CLIENT = httpx.Client(timeout=TIMEOUT, limits=httpx.Limits(max_keepalive_connections=0))
"""Every request on a connection of its own, as a new client's would be, without building a
new client's SSL context (50 ms of CPU) for each of the module's 350 requests."""


def post(url: str, route: str, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return CLIENT.post(url + route, content=body, headers=headers)


def as_item(route: str, request: bytes) -> bytes:
    """`request` where `route` expects it: as is, or as the only item of a batch."""
    return request if route == "/v1/systemone" else b'{"requests":[' + request + b"]}"


def with_state(state: bytes, model: bytes = b"laya") -> bytes:
    return b'{"model":"' + model + b'","state":' + state + b',"questions":{"q":{"type":"noul"}}}'


MALFORMED = {
    "empty": b"",
    "whitespace": b" \n\t ",
    "truncated": b'{"model":"laya","state":"s"',
    "unterminated string": b'{"model":"laya',
    "single quotes": b"{'model':'laya'}",
    "trailing comma": b'{"model":"laya",}',
    "trailing garbage": json.dumps(VALID).encode() + b" x",
    "two documents": json.dumps(VALID).encode() * 2,
    "bare word": b"laya",
    "NaN literal": with_state(b"NaN"),
    "Infinity literal": with_state(b"[-Infinity]"),
    "duplicate keys": b'{"model":"laya","model":"von","state":"s","questions":{}}',
    "byte order mark": b"\xef\xbb\xbf" + json.dumps(VALID).encode(),
    "nul byte": b'{"model":"laya"\x00}',
    "control char in string": b'{"model":"la\x01ya","state":"s","questions":{}}',
    "bad escape": with_state(b'"\\x41"'),
    "short unicode escape": with_state(b'"\\u12"'),
}
HUGE_NUMBERS = {
    "float overflow": with_state(b"[1e999]"),
    "negative float overflow": with_state(b'{"n":-1e400}'),
    "integer beyond 64 bits": with_state(b"[" + b"9" * 40 + b"]"),
    "negative integer beyond 64 bits": with_state(b'{"n":-' + b"9" * 25 + b"}"),
    "integer with 5000 digits": with_state(b"[" + b"7" * 5000 + b"]"),
    "huge integer in criteria": b'{"model":"laya","state":"s","questions":{"q":{"type":"choice",'
    b'"criteria":{"a":[' + b"1" * 30 + b"]}}}}",
    "huge temperature": b'{"model":"clm","state":"s","config":{"temperature":' + b"9" * 400 + b"},"
    b'"questions":{"q":{"type":"noul"}}}',
}
DEEP = {
    "arrays 2000 deep": with_state(b"[" * 2000 + b"]" * 2000),
    "objects 5000 deep": with_state(b'{"a":' * 5000 + b"1" + b"}" * 5000),
    "arrays 200000 deep unclosed": with_state(b"[" * 200_000),
    "nested instructions": b'{"model":"laya","state":"s","questions":{"q":{"type":"noul",'
    b'"instructions":' + b"[" * 3000 + b"]" * 3000 + b"}}}",
}
SURROGATES = {
    "in state": with_state(b'"\\ud800"'),
    "low half alone": with_state(b'["ok","\\udfff"]'),
    "reversed pair": with_state(b'"\\udc00\\ud800"'),
    "in model": with_state(b'"s"', model=b"\\ud83d"),
    "in question name": b'{"model":"laya","state":"s","questions":{"\\ud800":{"type":"noul"}}}',
    "in label": b'{"model":"laya","state":"s","questions":{"q":{"type":"choice",'
    b'"criteria":{"\\udbff":"x"}}}}',
    "in config key": b'{"model":"laya","state":"s","config":{"\\ud800":1},'
    b'"questions":{"q":{"type":"noul"}}}',
    "in unknown field": b'{"model":"laya","state":"s","\\ud800":1,'
    b'"questions":{"q":{"type":"noul"}}}',
}
INVALID_UTF8 = {
    "lone continuation byte": with_state(b'"\x80"'),
    "truncated sequence": with_state(b'"\xe2\x82"'),
    "overlong encoding": with_state(b'"\xc0\xaf"'),
    "encoded surrogate": with_state(b'"\xed\xa0\x80"'),
    "beyond U+10FFFF": with_state(b'"\xf4\x90\x80\x80"'),
    "latin-1 body": with_state('"café"'.encode("latin-1")),
    "utf-16 body": json.dumps(VALID).encode("utf-16"),
    "in a key": b'{"mo\xffdel":"laya","state":"s","questions":{"q":{"type":"noul"}}}',
}
HOSTILE = {**MALFORMED, **HUGE_NUMBERS, **DEEP, **SURROGATES, **INVALID_UTF8}


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Laya and Von on real worker subprocesses (the arith test engine)."""
    server = ops_server.start(
        tmp_path_factory.mktemp("fuzz-workers"), DECIDEALOT_MAX_RESIDENT_PROVIDERS="2"
    )
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_bodies_are_4xx(gateway: RunningServer, route: str, name: str) -> None:
    response = post(gateway.url, route, as_item(route, HOSTILE[name]))
    assert envelope_ok(response), (response.status_code, response.text[:300])


@pytest.mark.parametrize("name", list(HUGE_NUMBERS) + list(DEEP))
def test_hostile_values_never_reach_a_worker(workers: RunningServer, name: str) -> None:
    response = post(workers.url, "/v1/systemone", HOSTILE[name])
    assert envelope_ok(response), (response.status_code, response.text[:300])


def test_valid_unicode_is_accepted(workers: RunningServer) -> None:
    """The strictness above is not a blanket refusal of non-ASCII text or nesting."""
    state = ["\U0001f600 paired", "\\ud83d\\ude00", "nul \u0000 inside", [[[[{"n": 2**63 - 1}]]]]]
    body = json.dumps({**VALID, "state": state}).encode()
    escaped = with_state(b'"\\ud83d\\ude00 caf\\u00e9"')
    for payload in (body, escaped):
        response = post(workers.url, "/v1/systemone", payload)
        assert response.status_code == 200, response.text


@given(body=st.binary(max_size=400))
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_random_bytes_are_4xx(gateway: RunningServer, body: bytes) -> None:
    for route in ROUTES:
        response = post(gateway.url, route, body)
        assert envelope_ok(response), (route, body, response.status_code, response.text[:300])


SPLICES = [
    b"[" * 1500,
    b"1e999",
    b"-" + b"9" * 30,
    b'"\\udc80"',
    b'"\xff"',
    b"NaN",
    b"{",
    b"}",
    b'"',
    b",",
    b"\\",
]


@given(
    seed=st.integers(0, 2**32 - 1),
    splice=st.sampled_from(SPLICES),
    model=st.sampled_from(["laya", "von", "jev-latest", "clm"]),
)
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_spliced_requests_are_4xx(
    gateway: RunningServer, seed: int, splice: bytes, model: str
) -> None:
    """A valid request with a hostile fragment spliced in at a random position: never a 5xx.
    (Spliced into a string it may still be a valid request, so a 200 is allowed.)"""
    valid = json.dumps(
        {
            "model": model,
            "state": {"ticket": "refund", "items": [1, 2.5, None, True]},
            "questions": {"queue": {"type": "choice", "criteria": {"a": "x", "b": ["y"]}}},
        }
    ).encode()
    at = random.Random(seed).randrange(1, len(valid))
    body = valid[:at] + splice + valid[at:]
    for route in ROUTES:
        response = post(gateway.url, route, as_item(route, body))
        ok = response.status_code == 200 or envelope_ok(response)
        assert ok, (route, body[:200], response.status_code, response.text)


def test_the_server_still_serves(gateway: RunningServer, workers: RunningServer) -> None:
    for server in (gateway, workers):
        assert httpx.get(server.url + "/health").status_code == 200
        response = httpx.post(server.url + "/v1/systemone", json=VALID, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        assert "Traceback" not in Path(server.log_file).read_text()
