"""The service's metrics and their Prometheus text exposition (format 0.0.4) for `GET /metrics`.

A small registry of our own instead of `prometheus_client`: the gateway is one process (no
multiprocess mode to support), needs three metric kinds with labels and one output format, and
the format is small and stable; tests check the output with `prometheus_client`'s own parser.

Every metric the service exports is defined at the bottom of this module, so the names, labels
and help texts live in one place (docs/operations.md lists them). Label values are always
bounded sets (route templates, provider and catalog names, fixed reasons), never request
contents, and no metric ever carries a key.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

MEDIA_TYPE = "text/plain; version=0.0.4"
CONTENT_TYPE = MEDIA_TYPE + "; charset=utf-8"

LabelValues = tuple[str, ...]

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: from a cached fake's microseconds to a cold CPU forward pass over a long batch."""


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    """Integers without a fraction, infinities and NaN as the format spells them."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(
        f'{name}="{_escape_label(value)}"' for name, value in zip(names, values, strict=True)
    )
    return "{" + pairs + "}"


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> LabelValues:
        if labels.keys() != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {tuple(labels)}")
        return tuple(str(labels[name]) for name in self.label_names)

    def samples(self) -> Iterable[str]:
        raise NotImplementedError

    def render(self) -> str:
        header = f"# HELP {self.name} {_escape_help(self.help)}\n# TYPE {self.name} {self.kind}\n"
        return header + "".join(line + "\n" for line in self.samples())


class _Scalar(_Metric):
    """One number per label set: what counters and gauges share."""

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help, labels)
        self._values: dict[LabelValues, float] = {}

    def _add(self, amount: float, labels: dict[str, str]) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> Iterable[str]:
        with self._lock:
            items = sorted(self._values.items())
        for key, value in items:
            yield f"{self.name}{_labels(self.label_names, key)} {format_value(value)}"


class Counter(_Scalar):
    """A value that only goes up (`_total` names); reset only by a process restart."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter cannot go down")
        self._add(amount, labels)


class Gauge(_Scalar):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = value

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._add(-amount, labels)


class Histogram(_Metric):
    """Observations counted into cumulative `le` buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, help, labels)
        if "le" in self.label_names:
            raise ValueError("'le' is reserved for histogram buckets")
        bounds = sorted(float(b) for b in buckets)
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError("a histogram needs distinct bucket bounds")
        self.buckets = (*(b for b in bounds if not math.isinf(b)), math.inf)
        self._series: dict[LabelValues, list[float]] = {}
        """Per label set: a count per bucket (not cumulative), then the sum."""

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        index = next(i for i, bound in enumerate(self.buckets) if value <= bound)
        with self._lock:
            series = self._series.setdefault(key, [0.0] * (len(self.buckets) + 1))
            series[index] += 1
            series[-1] += value

    def count(self, **labels: str) -> int:
        series = self._series.get(self._key(labels))
        return 0 if series is None else int(sum(series[:-1]))

    def total(self, **labels: str) -> float:
        series = self._series.get(self._key(labels))
        return 0.0 if series is None else series[-1]

    def samples(self) -> Iterable[str]:
        with self._lock:
            items = sorted((key, list(series)) for key, series in self._series.items())
        bucket_names = (*self.label_names, "le")
        for key, series in items:
            cumulative = 0.0
            for bound, count in zip(self.buckets, series, strict=False):
                cumulative += count
                labels = _labels(bucket_names, (*key, format_value(bound)))
                yield f"{self.name}_bucket{labels} {format_value(cumulative)}"
            labels = _labels(self.label_names, key)
            yield f"{self.name}_sum{labels} {format_value(series[-1])}"
            yield f"{self.name}_count{labels} {format_value(cumulative)}"


class Registry:
    """Metrics in registration order; `render` is the whole `/metrics` body."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name!r} is already registered")
        self._metrics[metric.name] = metric

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help, labels)
        self._add(metric)
        return metric

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help, labels)
        self._add(metric)
        return metric

    def histogram(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        metric = Histogram(name, help, labels, buckets)
        self._add(metric)
        return metric

    def render(self) -> str:
        return "".join(metric.render() for metric in self._metrics.values())


# -- the service's metrics --------------------------------------------------------------------

REGISTRY = Registry()

HTTP_REQUESTS = REGISTRY.counter(
    "decidealot_http_requests_total",
    "HTTP requests answered, by route template, method and status code.",
    ("route", "method", "status"),
)
HTTP_DURATION = REGISTRY.histogram(
    "decidealot_http_request_duration_seconds",
    "Time from a request's arrival to the end of its response, by route template.",
    ("route",),
)
HTTP_IN_FLIGHT = REGISTRY.gauge(
    "decidealot_http_requests_in_flight", "HTTP requests being served now."
)
DECISIONS = REGISTRY.counter(
    "decidealot_decisions_total",
    "System One decisions (batch items count one each), by provider, requested model "
    "selector and outcome: ok, invalid (422), unavailable (503) or error.",
    ("provider", "model", "outcome"),
)
DECISION_DURATION = REGISTRY.histogram(
    "decidealot_decision_duration_seconds",
    "Time a provider took to answer one decision, waits for a slot or a load included.",
    ("provider",),
)
INPUT_TOKENS = REGISTRY.counter(
    "decidealot_input_tokens_total",
    "usage.input_tokens reported in successful decisions, by provider.",
    ("provider",),
)
FORWARD_PASS = REGISTRY.histogram(
    "decidealot_forward_pass_seconds",
    "Duration of one batched forward pass in a local provider's worker.",
    ("provider",),
)
BATCH_SIZE = REGISTRY.histogram(
    "decidealot_batch_size",
    "Jobs (requests) packed into one forward pass of a local provider's worker.",
    ("provider",),
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
BATCH_TOKENS = REGISTRY.histogram(
    "decidealot_batch_tokens",
    "Padded token cost of one forward pass, against DECIDEALOT_BATCH_TOKEN_BUDGET.",
    ("provider",),
    buckets=(64, 256, 1024, 4096, 16384, 32768, 65536, 131072),
)
PROVIDER_LOADS = REGISTRY.counter(
    "decidealot_provider_loads_total",
    "Local provider loads by residency, by provider and result: ok or failed.",
    ("provider", "result"),
)
PROVIDER_LOAD_DURATION = REGISTRY.histogram(
    "decidealot_provider_load_seconds",
    "Time to load a local provider (start its worker until it reports healthy).",
    ("provider",),
)
PROVIDER_UNLOADS = REGISTRY.counter(
    "decidealot_provider_unloads_total",
    "Local provider unloads, by provider and reason: evicted (to make room), idle, "
    "unload_all (POST /v1/models/unload) or shutdown.",
    ("provider", "reason"),
)
PROVIDER_RESIDENT = REGISTRY.gauge(
    "decidealot_provider_loaded",
    "1 while a local provider's worker is loaded and healthy, else 0.",
    ("provider",),
)
WORKER_STARTS = REGISTRY.counter(
    "decidealot_worker_starts_total",
    "Worker subprocesses that reported healthy, by provider.",
    ("provider",),
)
WORKER_RESTARTS = REGISTRY.counter(
    "decidealot_worker_restarts_total",
    "Worker starts that replaced a worker lost to a crash, hang or corrupt output.",
    ("provider",),
)
WORKER_FAILURES = REGISTRY.counter(
    "decidealot_worker_failures_total",
    "Workers lost or refused, by provider and reason: start_failed, exited, timeout or malformed.",
    ("provider", "reason"),
)
ENCODER_FAILURES = REGISTRY.counter(
    "decidealot_encoder_failures_total",
    "Failed calls to CLM's embeddings endpoint (after retries), by reason: timeout, "
    "connection, status or invalid_reply.",
    ("reason",),
)
UPSTREAM_FAILURES = REGISTRY.counter(
    "decidealot_upstream_failures_total",
    "Failed calls to a hosted upstream (Jev's TypeSafe API, after retries), by provider, "
    "upstream route and reason: key_rejected, refused, unavailable, timeout, connection, "
    "invalid_reply or not_started.",
    ("provider", "route", "reason"),
)
REQUESTS_CANCELLED = REGISTRY.counter(
    "decidealot_requests_cancelled_total",
    "Decision requests to local providers whose caller went away (HTTP client disconnected, "
    "MCP request cancelled) before the answer, by provider: their waits ended and their "
    "queued passes were withdrawn.",
    ("provider",),
)
JOBS_WITHDRAWN = REGISTRY.counter(
    "decidealot_jobs_withdrawn_total",
    "Jobs withdrawn from a worker after their caller went away, by provider.",
    ("provider",),
)
ADMISSION_REJECTED = REGISTRY.counter(
    "decidealot_admission_rejected_total",
    "Decision requests answered 503 at once because DECIDEALOT_MAX_PENDING_REQUESTS were "
    "already admitted to local providers.",
)
PENDING_REQUESTS = REGISTRY.gauge(
    "decidealot_pending_requests",
    "Decision requests admitted to local providers and not yet answered.",
)
