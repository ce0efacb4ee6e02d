"""OpenTelemetry traces over real servers, received by a local OTLP/HTTP collector.

Requests carry a caller's W3C `traceparent` (HTTP header, MCP `_meta`); the spans that reach
tests/support/otlp_receiver.py must continue that trace, nest as the service runs the request
(admission, validation, decision, queue waits, forward passes made in the worker, encoder and
TypeSafe calls), name the request id, and hold no state, instruction or criterion text and no
key anywhere in what was exported. Tracing is off, at no cost, unless OTEL_* configures it.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from decidealot import registry
from decidealot.providers.clm.tiny import build_clm_head
from tests.support import ops_launcher as ops_server
from tests.support.cli import NO_LOCAL, run_cli
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.fake_typesafe import SYSTEM_ONE_PATH, FakeTypeSafe, Fault, serve
from tests.support.mcp_clients import over_stdio
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.servers import ALL_FAKES, RunningServer, start_server

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "trace-test-key-5f0c"
TYPESAFE_KEY = "typesafe-upstream-key-77d1"
EMBEDDINGS_KEY = "embeddings-key-a93e"
SECRETS = ("STATE-MARKER-3d1f", "INSTRUCTION-MARKER-9b2c", "CRITERION-MARKER-41aa")
SERVER, CLIENT = 2, 3
"""The OTLP protobuf's span kinds."""


def decision(model: str) -> dict[str, Any]:
    """A request whose every caller-written text is a marker that must never be exported."""
    state, instruction, criterion = SECRETS
    return {
        "model": model,
        "state": {"ticket": state},
        "questions": {
            "urgent": {
                "type": "noul",
                "instructions": instruction,
                "criteria": {"true": criterion, "false": "no"},
            }
        },
    }


def caller() -> tuple[str, str, str]:
    """A fresh caller span: its trace id, span id and `traceparent` header value."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "decidealot-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


def in_trace(receiver: OtlpReceiver, trace_id: str, *names: str) -> list[ReceivedSpan]:
    """The trace's spans once every name in `names` has arrived in it. Name the spans a test
    reads that end last (the request's own, after its answer is sent): one process exports its
    spans in the order they end, so those that ended before them have arrived too."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        arrived = [s.name for s in spans if s.trace_id == trace_id]
        return all(arrived.count(name) >= names.count(name) for name in set(names))

    spans = [s for s in receiver.wait_for(complete) if s.trace_id == trace_id]
    assert complete(spans), sorted(s.name for s in spans)
    return spans


def one(spans: list[ReceivedSpan], name: str, parent: ReceivedSpan | None = None) -> ReceivedSpan:
    found = [
        s for s in spans if s.name == name and (parent is None or s.parent_id == parent.span_id)
    ]
    assert len(found) == 1, (name, [(s.name, s.parent_id) for s in spans])
    return found[0]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_id == parent.span_id]


def assert_clean(receiver: OtlpReceiver, *keys: str) -> None:
    """Nothing exported, in any span of any trace, holds request text or a key."""
    assert receiver.bodies
    for body in receiver.bodies:
        for text in (*SECRETS, *keys):
            assert text.encode() not in body, text


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[RunningServer]:
    """The production server with real worker subprocesses (tests/ops_server), keyed."""
    server = ops_server.start(
        tmp_path_factory.mktemp("traced"), DECIDEALOT_API_KEY=API_KEY, **otel_env(receiver)
    )
    yield server
    assert server.stop() == 0


def post(server: RunningServer, path: str, body: Any, **headers: str) -> httpx.Response:
    """With the key `traced` wants (servers without a key ignore it)."""
    return httpx.post(
        server.url + path,
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}", **headers},
        timeout=120,
    )


def test_an_http_request_continues_the_callers_trace(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    trace_id, parent_id, header = caller()
    response = post(traced, "/v1/systemone", decision("laya"), traceparent=header)
    assert response.status_code == 200, response.text

    spans = in_trace(receiver, trace_id, "POST /v1/systemone", "forward_pass")
    request = one(spans, "POST /v1/systemone")
    assert request.parent_id == parent_id and request.kind == SERVER
    assert request.service == "decidealot-under-test"
    assert request.attributes["decidealot.request_id"] == response.headers["x-request-id"]
    assert request.attributes["http.route"] == "/v1/systemone"
    assert request.attributes["http.response.status_code"] == 200
    assert {"admission", "validation", "decision"} <= {s.name for s in children(spans, request)}
    made = one(spans, "decision", request)
    assert made.attributes["decidealot.provider"] == "laya"
    assert made.attributes["decidealot.model"] == "laya"
    one(spans, "queue.slot", made)
    forward = one(spans, "forward_pass", made)  # made in the worker, reported by its frame
    assert forward.attributes["decidealot.provider"] == "laya"
    assert forward.attributes["decidealot.jobs"] >= 1
    assert forward.attributes["decidealot.tokens"] > 0
    assert forward.attributes["decidealot.rows"] >= 1
    assert made.start_ns <= forward.start_ns <= forward.end_ns <= made.end_ns
    assert_clean(receiver, API_KEY)


def test_log_lines_written_inside_a_span_carry_its_trace_and_span(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    """A log search finds the trace, and the trace view finds its lines: every line a request
    writes names its trace and the span it was written in; lines outside any span name none."""
    trace_id, _, header = caller()
    response = post(traced, "/v1/systemone", decision("laya"), traceparent=header)
    assert response.status_code == 200, response.text
    spans = in_trace(receiver, trace_id, "POST /v1/systemone", "forward_pass")
    request = one(spans, "POST /v1/systemone")
    lines = [json.loads(line) for line in traced.log_lines() if line.strip()]
    mine = [line for line in lines if line["request_id"] == response.headers["x-request-id"]]
    access = [line for line in mine if line["message"].startswith("POST /v1/systemone 200")]
    assert len(access) == 1
    assert (access[0]["trace_id"], access[0]["span_id"]) == (trace_id, request.span_id)
    ids = {span.span_id for span in spans}
    assert all(line["trace_id"] == trace_id and line["span_id"] in ids for line in mine)
    (started,) = [line for line in lines if line["message"].startswith("starting on http://")]
    assert "trace_id" not in started and "span_id" not in started


def test_each_batch_item_is_a_decision_with_its_forward_pass(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    trace_id, parent_id, header = caller()
    batch = {"requests": [decision("laya"), decision("von")]}
    response = post(traced, "/v1/systemone/batch", batch, traceparent=header)
    assert response.status_code == 200, response.text

    names = ("POST /v1/systemone/batch", "decision", "decision", "forward_pass", "forward_pass")
    spans = in_trace(receiver, trace_id, *names)
    request = one(spans, "POST /v1/systemone/batch")
    assert request.parent_id == parent_id
    made = [s for s in children(spans, request) if s.name == "decision"]
    assert sorted(s.attributes["decidealot.provider"] for s in made) == ["laya", "von"]
    for item in made:
        one(spans, "forward_pass", item)
    assert_clean(receiver, API_KEY)


def test_a_request_without_traceparent_starts_its_own_trace(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    response = post(traced, "/v1/systemone", decision("von"))
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    spans = receiver.wait_for(
        lambda got: any(s.attributes.get("decidealot.request_id") == request_id for s in got)
    )
    request = next(s for s in spans if s.attributes.get("decidealot.request_id") == request_id)
    assert request.parent_id == "" and request.kind == SERVER


def test_a_failing_request_marks_its_spans_failed_by_type_only(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    trace_id, _, header = caller()
    body = decision("laya")
    body["state"]["arith"] = {"fail": "run"}  # the engine raises with the state in its message
    response = post(traced, "/v1/systemone", body, traceparent=header)
    assert response.status_code == 503
    spans = in_trace(receiver, trace_id, "POST /v1/systemone", "decision")
    request = one(spans, "POST /v1/systemone")
    assert request.status == 2 and request.attributes["error.type"] == "503"
    assert one(spans, "decision", request).attributes["error.type"] == "ProviderUnavailable"
    assert_clean(receiver, API_KEY)


def test_an_invalid_request_fails_its_validation_span(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    trace_id, _, header = caller()
    body = decision("laya") | {"config": {"temperature": 1}}
    assert post(traced, "/v1/systemone", body, traceparent=header).status_code == 422
    spans = in_trace(receiver, trace_id, "POST /v1/systemone", "validation")
    assert one(spans, "validation").attributes["error.type"] == "RequestInvalid"
    assert not [s for s in spans if s.name == "decision"]
    assert_clean(receiver, API_KEY)


def pending(server: RunningServer) -> float:
    """`decidealot_pending_requests` as the server reports it now."""
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    samples = (s for f in text_string_to_metric_families(text) for s in f.samples)
    return next((s.value for s in samples if s.name == "decidealot_pending_requests"), 0.0)


def test_a_request_over_the_pending_bound_fails_its_admission_span(
    launch: Callable[..., RunningServer], receiver: OtlpReceiver
) -> None:
    server = launch(**ALL_FAKES, DECIDEALOT_MAX_PENDING_REQUESTS="1", **otel_env(receiver))
    slow = {**decision("laya"), "state": {"fake": {"sleep": 3.0}}}
    with ThreadPoolExecutor(1) as pool:
        admitted = pool.submit(post, server, "/v1/systemone", slow)
        while pending(server) < 1:
            assert not admitted.done(), admitted.result().text
        trace_id, _, header = caller()
        refused = post(server, "/v1/systemone", decision("laya"), traceparent=header)
        assert refused.status_code == 503
        assert admitted.result().status_code == 200
    spans = in_trace(receiver, trace_id, "POST /v1/systemone", "admission")
    admission = one(spans, "admission", one(spans, "POST /v1/systemone"))
    assert admission.status == 2 and admission.attributes["error.type"] == "ProviderOverloaded"
    assert admission.attributes["decidealot.pending"] == 1
    assert not [s for s in spans if s.name == "decision"]


def mcp_call(
    server: RunningServer,
    arguments: dict[str, Any],
    meta: dict[str, str] | None = None,
    **headers: str,
) -> httpx.Response:
    """`tools/call system_one` as one stateless POST to /mcp, `meta` as its `_meta`."""
    params: dict[str, Any] = {"name": "system_one", "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
    return httpx.post(
        server.url + "/mcp",
        content=json.dumps(message),
        headers={
            "Authorization": f"Bearer {API_KEY}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **headers,
        },
        timeout=60,
    )


def test_an_mcp_call_continues_the_traceparent_in_its_meta(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    trace_id, parent_id, header = caller()
    response = mcp_call(traced, decision("von"), meta={"traceparent": header})
    assert response.status_code == 200 and '"isError":false' in response.text, response.text

    spans = in_trace(receiver, trace_id, "tools/call system_one", "forward_pass")
    call = one(spans, "tools/call system_one")
    assert call.parent_id == parent_id and call.kind == SERVER
    assert call.attributes["decidealot.request_id"] == response.headers["x-request-id"]
    assert {"validation", "decision"} <= {s.name for s in children(spans, call)}
    one(spans, "forward_pass", one(spans, "decision", call))
    assert_clean(receiver, API_KEY)


def test_an_mcp_call_without_meta_nests_under_its_http_request(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    trace_id, parent_id, header = caller()
    response = mcp_call(traced, decision("laya"), traceparent=header)
    assert response.status_code == 200, response.text
    spans = in_trace(receiver, trace_id, "POST /mcp", "tools/call system_one", "forward_pass")
    request = one(spans, "POST /mcp")
    assert request.parent_id == parent_id
    call = one(spans, "tools/call system_one", request)
    one(spans, "forward_pass", one(spans, "decision", call))


async def test_mcp_over_stdio_forwards_the_trace_to_the_server(
    traced: RunningServer, receiver: OtlpReceiver
) -> None:
    """`decidealot mcp --url`: its tool span continues `_meta`, its forwarded call carries it."""
    trace_id, parent_id, header = caller()
    env = {"DECIDEALOT_API_KEY": API_KEY, **otel_env(receiver)}
    async with over_stdio(["--url", traced.url], env) as client:
        result = await client.call_tool("system_one", decision("von"), meta={"traceparent": header})
        assert not result.is_error, result
    spans = in_trace(receiver, trace_id, "tools/call system_one", "POST /v1/systemone")
    call = one(spans, "tools/call system_one")
    assert call.parent_id == parent_id
    assert call.service == "decidealot-under-test"
    request = one(spans, "POST /v1/systemone", call)
    one(spans, "forward_pass", one(spans, "decision", request))
    assert_clean(receiver, API_KEY)


def test_spans_still_queued_at_sigterm_are_sent_before_exit(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    server = ops_server.start(
        tmp_path, **otel_env(receiver) | {"OTEL_BSP_SCHEDULE_DELAY": "600000"}
    )
    trace_id, _, header = caller()
    response = post(server, "/v1/systemone", decision("laya"), traceparent=header)
    assert response.status_code == 200
    assert server.stop() == 0
    spans = [s for s in receiver.wait_for(lambda _: True, timeout=0) if s.trace_id == trace_id]
    assert {"POST /v1/systemone", "decision", "forward_pass"} <= {s.name for s in spans}


def test_typesafe_calls_carry_the_trace(tmp_path: Path, receiver: OtlpReceiver) -> None:
    """`decidealot serve` with hosted Jev only: the real TypeSafe client against the fake."""
    with serve(FakeTypeSafe(TYPESAFE_KEY)) as typesafe:
        server = start_server(
            tmp_path,
            launcher="decidealot",
            args=("serve",),
            DECIDEALOT_TYPESAFE_API_KEY=TYPESAFE_KEY,
            DECIDEALOT_TYPESAFE_BASE_URL=typesafe.url,
            **NO_LOCAL,
            **otel_env(receiver),
        )
        try:
            trace_id, parent_id, header = caller()
            response = post(server, "/v1/systemone", decision("jev-latest"), traceparent=header)
            assert response.status_code == 200, response.text
            spans = in_trace(receiver, trace_id, "POST /v1/systemone", "typesafe")
            sent = [r.headers.get("traceparent") for r in typesafe.calls("/v1/systemone")]
            typesafe.persistent[SYSTEM_ONE_PATH] = Fault(status=401)
            failed_id, _, failing = caller()
            response = post(server, "/v1/systemone", decision("jev-latest"), traceparent=failing)
            assert response.status_code == 503
            failed = one(in_trace(receiver, failed_id, "typesafe"), "typesafe")
        finally:
            assert server.stop() == 0
    assert failed.attributes["decidealot.failure"] == "key_rejected"
    assert failed.status == 2 and failed.attributes["error.type"] == "ProviderUnavailable"
    request = one(spans, "POST /v1/systemone")
    assert request.parent_id == parent_id
    calls = [s for s in spans if s.name == "typesafe"]
    decided = one(calls, "typesafe", one(spans, "decision", request))
    assert decided.kind == CLIENT
    assert decided.attributes["http.request.method"] == "POST"
    assert decided.attributes["url.path"] == "/v1/systemone"
    assert sent == [f"00-{trace_id}-{decided.span_id}-01"]
    assert_clean(receiver, TYPESAFE_KEY)


def test_encoder_calls_and_the_head_pass_carry_the_trace(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """`decidealot serve` with CLM only: the real encoder client and a real head worker."""
    embeddings = FakeEmbeddings(4096).start()
    head = build_clm_head(tmp_path / "head.pt", hidden=4096, width=24, proj=8, seed=3)
    try:
        server = start_server(
            tmp_path / "server",
            launcher="decidealot",
            args=("serve",),
            DECIDEALOT_CLM_EMBEDDINGS_URL=embeddings.url,
            DECIDEALOT_CLM_EMBEDDINGS_API_KEY=EMBEDDINGS_KEY,
            DECIDEALOT_CLM_HEAD=str(head),
            DECIDEALOT_DEVICE="cpu",
            DECIDEALOT_TORCH_THREADS="1",
            **NO_LOCAL,
            **otel_env(receiver),
        )
        try:
            trace_id, parent_id, header = caller()
            body = decision("clm")
            body["questions"]["urgent"] = {
                "type": "choice",
                "instructions": SECRETS[1],
                "criteria": {"yes": SECRETS[2], "no": "not urgent"},
            }
            response = post(server, "/v1/systemone", body, traceparent=header)
            assert response.status_code == 200, response.text
            names = ("POST /v1/systemone", "encoder", "forward_pass", "queue.lane")
            spans = in_trace(receiver, trace_id, *names)
            sent = list(embeddings.traceparents)
            embeddings.mode = "wrong_width"
            failed_id, _, failing = caller()
            response = post(server, "/v1/systemone", body, traceparent=failing)
            assert response.status_code == 503
            failed = one(in_trace(receiver, failed_id, "encoder"), "encoder")
        finally:
            assert server.stop() == 0
    finally:
        embeddings.stop()
    assert failed.attributes["decidealot.failure"] == "invalid_reply"
    assert failed.status == 2 and failed.attributes["error.type"] == "ProviderUnavailable"
    request = one(spans, "POST /v1/systemone")
    assert request.parent_id == parent_id
    made = one(spans, "decision", request)
    assert made.attributes["decidealot.provider"] == "clm"
    encoder = [s for s in spans if s.name == "encoder"]
    assert encoder and all(s.kind == CLIENT for s in encoder)
    assert set(sent) == {f"00-{trace_id}-{s.span_id}-01" for s in encoder}
    lane = one(spans, "queue.lane")
    assert lane.attributes["decidealot.lane"] == "local"
    one(spans, "queue.slot")
    assert one(spans, "forward_pass").attributes["decidealot.provider"] == "clm"
    assert_clean(receiver, EMBEDDINGS_KEY)


# -- settings ---------------------------------------------------------------------------------


def cli(*args: str, code: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, code=code, clear=("DECIDEALOT_", "OTEL_"), timeout=60, **(NO_LOCAL | env))


@pytest.mark.parametrize(
    ("env", "variable", "accepts"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER", "otlp or none"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER", "otlp or none"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "http/protobuf",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "http/protobuf",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT", "URL"),
        ({"OTEL_SDK_DISABLED": "perhaps"}, "OTEL_SDK_DISABLED", "true or false"),
    ],
)
def test_a_bad_tracing_setting_stops_startup_naming_it(
    env: dict[str, str], variable: str, accepts: str
) -> None:
    result = cli("serve", **env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and accepts in lines[0], result.stderr


def test_tracing_without_the_sdk_installed_stops_startup_naming_the_extra() -> None:
    hide_sdk = (
        "import sys; sys.modules['opentelemetry.sdk'] = None; "
        "from decidealot.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = cli("serve", code=hide_sdk, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
    assert result.returncode == 2
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in result.stderr
    assert "decidealot[otel]" in result.stderr


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, ()),
        ({"OTEL_SERVICE_NAME": "decidealot"}, ()),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/v1/traces"}, ("otlp",)),
    ],
)
def test_only_an_exporter_turns_tracing_on(env: dict[str, str], exporters: tuple[str, ...]) -> None:
    assert registry.from_env(env).trace_exporters == exporters


def test_tracing_off_never_imports_the_sdk_and_spans_cost_nothing() -> None:
    code = """
import sys
from decidealot import registry, tracing
tracing.setup(registry.from_env({}))
first = tracing.span("decision", provider="laya")
assert first is tracing.span("validation"), "a new object per span while off"
with first as span:
    span.set({"http.route": "/"}, request_id="r")
    assert tracing.current() is None
headers = {}
tracing.inject(headers)
assert headers == {}
assert tracing.extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
assert not [m for m in sys.modules if m.startswith("opentelemetry.sdk")]
print("ok")
"""
    result = cli(code=code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
