"""OpenTelemetry traces, off unless the standard OTEL_* variables configure an exporter: until
`setup` installs the SDK (the `decidealot[otel]` extra), each helper here costs one check. The
API package is a plain dependency: the MCP SDK needs it anyway.

Spans never carry request text, keys or exception messages (which may quote the state); only
W3C `traceparent`/`tracestate` travel, in and out (docs/operations.md#traces).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Literal, ParamSpec, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from decidealot import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from decidealot.config import Settings

log = logging.getLogger("decidealot.tracing")

P = ParamSpec("P")
T = TypeVar("T")
Kind = Literal["internal", "server", "client"]
Attribute = str | int | float | bool
SHUTDOWN_SECONDS = 5.0  # how long exiting waits for queued spans to reach the collector

_KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = ("traceparent", "tracestate")
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None


class Span:
    """A handle on the current span: attributes and failure; does nothing while tracing is off."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span | None) -> None:
        self._span = span

    def set(self, attributes: Mapping[str, Attribute] | None = None, **named: Attribute) -> None:
        """`attributes` keep their (semantic-convention) names; `named` ones get `decidealot.`."""
        if self._span is not None:
            self._span.set_attributes({**(attributes or {}), **_named(named)})

    def fail(self, error_type: str) -> None:
        """Mark the span failed with `error.type` (a type or code, never a message)."""
        if self._span is not None:
            self._span.set_attribute("error.type", error_type)
            self._span.set_status(Status(StatusCode.ERROR))


_OFF = contextlib.nullcontext(Span(None))


def setup(settings: Settings) -> None:
    global _tracer, _provider
    if not settings.trace_exporters or _provider is not None:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "decidealot"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("decidealot", __version__)
    log.info("tracing on: OTLP/HTTP export as %s", resource.attributes.get(SERVICE_NAME))


def shutdown() -> None:
    """Send the spans still queued, then stop exporting; for processes that leave by os._exit.
    Bounded by `SHUTDOWN_SECONDS`: an unreachable collector must not hold up an exit."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is None:
        return
    # The SDK's flush waits out an export in progress, retries included, whatever its timeout.
    flushing = threading.Thread(target=provider.shutdown, name="trace-flush", daemon=True)
    flushing.start()
    flushing.join(SHUTDOWN_SECONDS)
    if flushing.is_alive():
        log.warning("spans not sent within %.0f s of exiting were dropped", SHUTDOWN_SECONDS)


def span(
    name: str,
    *,
    kind: Kind = "internal",
    parent: Context | None = None,
    attributes: Mapping[str, Attribute] | None = None,
    **named: Attribute,
) -> contextlib.AbstractContextManager[Span]:
    """A span around a block, current inside it: a child of `parent`, else of the current one."""
    if _tracer is None:
        return _OFF
    return _live(_tracer, name, _KINDS[kind], parent, {**(attributes or {}), **_named(named)})


@contextlib.contextmanager
def _live(
    tracer: trace.Tracer,
    name: str,
    kind: SpanKind,
    parent: Context | None,
    attributes: dict[str, Attribute],
) -> Iterator[Span]:
    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        record_exception=False,  # its message and frames may quote the state
        set_status_on_exception=False,
    ) as live:
        handle = Span(live)
        try:
            yield handle
        except BaseException as exc:
            handle.fail(type(exc).__name__)
            raise


def traced(
    name: str, kind: Kind = "internal"
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Run an async function inside a span called `name` (a one-line insertion at a def)."""

    def decorate(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            if _tracer is None:
                return await function(*args, **kwargs)
            with span(name, kind=kind):
                return await function(*args, **kwargs)

        return wrapper

    return decorate


def annotate(attributes: Mapping[str, Attribute] | None = None, **named: Attribute) -> None:
    """Add attributes to the current span (ours or the MCP SDK's), as `Span.set` does."""
    if _tracer is not None:
        Span(trace.get_current_span()).set(attributes, **named)


def current() -> SpanContext | None:
    """The current span, to parent spans recorded later (None while off or outside one)."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def record(
    name: str, parent: SpanContext | None, start: float, end: float, **named: Attribute
) -> None:
    """A span that already happened elsewhere (a forward pass in the worker): `start` and
    `end` are `time.time()` seconds. Nothing without a `parent` from `current()`."""
    if _tracer is None or parent is None:
        return
    context = trace.set_span_in_context(NonRecordingSpan(parent))
    finished = _tracer.start_span(
        name, context=context, attributes=_named(named), start_time=int(start * 1e9)
    )
    finished.end(end_time=int(max(start, end) * 1e9))


def extract(headers: Mapping[str, str] | Mapping[bytes, bytes] | None) -> Context | None:
    """The caller's trace from its W3C `traceparent` (and `tracestate`): HTTP headers (str or
    raw ASGI bytes, lower-case names) or an MCP `_meta`. None when off, absent or invalid."""
    if _tracer is None or not headers:
        return None
    carrier: dict[str, str] = {}
    for header in _TRACE_HEADERS:
        value = headers.get(header) or headers.get(header.encode())  # type: ignore[call-overload]
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str):
            carrier[header] = value
    context = _PROPAGATOR.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject(headers: MutableMapping[str, str]) -> None:
    if _tracer is not None:
        _PROPAGATOR.inject(headers)


def _named(attributes: Mapping[str, Attribute]) -> dict[str, Attribute]:
    return {f"decidealot.{key}": value for key, value in attributes.items()}
