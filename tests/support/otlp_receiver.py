"""A local OTLP/HTTP trace receiver for tests: `POST /v1/traces` on a loopback port.

Each body is decoded as the collector's `ExportTraceServiceRequest` protobuf (opentelemetry-proto),
gzip or not, and its spans kept as `ReceivedSpan`s; the raw bodies are kept too, so tests can
check that no state text or key reached the collector in any form.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    """Hex; empty for a root span."""
    name: str
    kind: int
    """The protobuf's SpanKind: 1 internal, 2 server, 3 client."""
    attributes: dict[str, Any]
    status: int
    """The protobuf's status code: 0 unset, 1 ok, 2 error."""
    start_ns: int
    end_ns: int
    service: str


def _value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    return getattr(value, field) if field else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 30
    ) -> list[ReceivedSpan]:
        """Every span received, once `found` holds for them (or the timeout passed)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if found(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def _keep(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status=span.status.code,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            service=str(resource.get("service.name")),
                        )
                    )
        with self._lock:
            self.bodies.append(body)
            self.spans.extend(spans)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != TRACES_PATH:
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._keep(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
