"""The service's metrics on prometheus_client (docs/operations.md lists them), for `/metrics`.

Label values, passed as keywords, come from bounded sets (route templates, provider names, fixed
reasons), never request contents or keys. `REGISTRY` is private: prometheus_client's global one
may be filled by other libraries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import prometheus_client
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format every scraper reads
MEDIA_TYPE = CONTENT_TYPE.removesuffix("; charset=utf-8")  # Litestar appends the charset

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: from a cached fake's microseconds to a cold CPU forward pass over a long batch."""

# `_created` series double every counter and histogram and no dashboard here reads them.
prometheus_client.disable_created_metrics()


class _Private:
    """Registered in `REGISTRY` unless another registry is given."""

    def __init__(self, *args: Any, registry: CollectorRegistry | None = None, **kw: Any) -> None:
        super().__init__(*args, registry=REGISTRY if registry is None else registry, **kw)


class Counter(_Private, prometheus_client.Counter):
    def inc(self, amount: float = 1.0, **labels: str) -> None:
        (self.labels(**labels) if labels else super()).inc(amount)


class Gauge(_Private, prometheus_client.Gauge):
    def set(self, value: float, **labels: str) -> None:
        (self.labels(**labels) if labels else super()).set(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        (self.labels(**labels) if labels else super()).inc(amount)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        (self.labels(**labels) if labels else super()).dec(amount)

    def remove(self, **labels: str) -> None:
        """Drop every series these label values match (all of them, when they name fewer
        labels than the gauge has) from `/metrics`; a series never set is no error."""
        self.remove_by_labels(labels)


class Info(Gauge):
    """A gauge at 1 whose labels say what holds for a (provider, checkpoint) now: setting one
    again replaces its series, so one series per checkpoint is ever exposed."""

    def set(self, value: float = 1.0, **labels: str) -> None:
        if labels:
            self.remove(provider=labels["provider"], checkpoint=labels["checkpoint"])
        super().set(value, **labels)


class Histogram(_Private, prometheus_client.Histogram):
    def __init__(self, *args: Any, buckets: Sequence[float] = DEFAULT_BUCKETS, **kw: Any) -> None:
        super().__init__(*args, buckets=buckets, **kw)

    def observe(self, amount: float, **labels: str) -> None:
        (self.labels(**labels) if labels else super()).observe(amount)


class ResidencyView(Protocol):  # what `ServiceCollector` reads of `Residency`
    @property
    def names(self) -> list[str]: ...

    def loaded(self, name: str) -> bool: ...


class LedgerView(Protocol):  # what `ServiceCollector` reads of `Ledger`
    def waiting(self, provider: str | None = None) -> int: ...

    def holding(self, provider: str | None = None) -> int: ...

    def oldest_waiting(self, provider: str) -> float: ...


class ServiceCollector:
    """One service's `/metrics`: the process's metrics plus gauges read from it at scrape time
    (services sharing a process, as in tests, each report their own)."""

    def __init__(
        self,
        residency: ResidencyView,
        ledger: LedgerView | None = None,
        connections: Callable[[], int | None] | None = None,
    ) -> None:
        """`ledger`: the queue gauges; `connections`: the open connections now (None: unknown)."""
        self._residency = residency
        self._ledger = ledger
        self._connections = connections

    def collect(self) -> Iterable[Metric]:
        yield from REGISTRY.collect()
        loaded = GaugeMetricFamily(
            "decidealot_provider_loaded",
            "1 while a local provider's worker is loaded and healthy, else 0.",
            labels=("provider",),
        )
        for name in self._residency.names:
            loaded.add_metric((name,), float(self._residency.loaded(name)))
        yield loaded
        if self._ledger is not None:
            yield from self._queue(self._ledger)
        count = self._connections() if self._connections is not None else None
        if count is not None:
            yield GaugeMetricFamily(
                "decidealot_open_connections",
                "HTTP connections open on the API port now, idle and half-sent ones included "
                "(against DECIDEALOT_MAX_CONNECTIONS).",
                value=count,
            )

    def _queue(self, ledger: LedgerView) -> Iterable[Metric]:
        """What an autoscaler reads: the local decisions waiting for and holding each slot."""
        queued = GaugeMetricFamily(
            "decidealot_decisions_queued",
            "Local decisions admitted and waiting for their provider's residency slot (a load, "
            "a model switch or a slot held by another provider), by provider.",
            labels=("provider",),
        )
        running = GaugeMetricFamily(
            "decidealot_decisions_running",
            "Local decisions holding their provider's slot: in or waiting for its forward "
            "passes, by provider.",
            labels=("provider",),
        )
        oldest = GaugeMetricFamily(
            "decidealot_decisions_queued_oldest_seconds",
            "How long the longest-waiting of a provider's queued decisions has waited (0: none "
            "waits), by provider.",
            labels=("provider",),
        )
        for name in self._residency.names:
            queued.add_metric((name,), float(ledger.waiting(name)))
            running.add_metric((name,), float(ledger.holding(name)))
            oldest.add_metric((name,), ledger.oldest_waiting(name))
        yield from (queued, running, oldest)

    def render(self) -> bytes:
        return generate_latest(self)


# -- the service's metrics --------------------------------------------------------------------

REGISTRY = CollectorRegistry()
for _standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_standard)

HTTP_REQUESTS = Counter(
    "decidealot_http_requests_total",
    "HTTP requests answered, by route template, method and status code.",
    ("route", "method", "status"),
)
HTTP_DURATION = Histogram(
    "decidealot_http_request_duration_seconds",
    "Time from a request's arrival to the end of its response, by route template.",
    ("route",),
)
HTTP_IN_FLIGHT = Gauge("decidealot_http_requests_in_flight", "HTTP requests being served now.")
DECISIONS = Counter(
    "decidealot_decisions_total",
    "System One decisions (batch items count one each), by provider, requested model "
    "selector and outcome: ok, invalid (422), unavailable (503) or error.",
    ("provider", "model", "outcome"),
)
DECISION_DURATION = Histogram(
    "decidealot_decision_duration_seconds",
    "Time a provider took to answer one decision, waits for a slot or a load included.",
    ("provider",),
)
INPUT_TOKENS = Counter(
    "decidealot_input_tokens_total",
    "usage.input_tokens reported in successful decisions, by provider.",
    ("provider",),
)
TRUNCATED_STATES = Counter(
    "decidealot_truncated_states_total",
    "Decisions whose state a local model read only in part for at least one question (cut as "
    "its upstream cuts, DECIDEALOT_LONG_STATES=cut), by provider and checkpoint.",
    ("provider", "checkpoint"),
)
FORWARD_PASS = Histogram(
    "decidealot_forward_pass_seconds",
    "Duration of one batched forward pass in a local provider's worker.",
    ("provider",),
)
BATCH_SIZE = Histogram(
    "decidealot_batch_size",
    "Jobs (requests) packed into one forward pass of a local provider's worker.",
    ("provider",),
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
BATCH_TOKENS = Histogram(
    "decidealot_batch_tokens",
    "Padded token cost of one forward pass, against DECIDEALOT_BATCH_TOKEN_BUDGET.",
    ("provider",),
    buckets=(64, 256, 1024, 4096, 16384, 32768, 65536, 131072),
)
PROVIDER_LOADS = Counter(
    "decidealot_provider_loads_total",
    "Local provider loads by residency, by provider and result: ok or failed.",
    ("provider", "result"),
)
PROVIDER_LOAD_DURATION = Histogram(
    "decidealot_provider_load_seconds",
    "Time to load a local provider (start its worker until it reports healthy).",
    ("provider",),
)
PROVIDER_UNLOADS = Counter(
    "decidealot_provider_unloads_total",
    "Local provider unloads, by provider and reason: evicted (to make room), idle, "
    "unload_all (POST /v1/models/unload) or shutdown.",
    ("provider", "reason"),
)
INT8_LINEAR_SHARE = Gauge(
    "decidealot_int8_linear_share",
    "Share (0-1) of a loaded checkpoint's encoder linear layers that run int8, by provider "
    "and checkpoint: 1 when DECIDEALOT_PRECISION=int8 quantised them all, less where the "
    "load-time probe kept some in fp32, 0 under the other precisions. A checkpoint has a "
    "series only while it is loaded.",
    ("provider", "checkpoint"),
)
PRECISION_INFO = Info(
    "decidealot_precision_info",
    "1 per loaded checkpoint: the precision it runs in, the DECIDEALOT_PRECISION "
    "value it came from (requested) and why (reason: requested, what auto chose on which CPU "
    "flags, or the load probe's fallback to fp32).",
    ("provider", "checkpoint", "precision", "requested", "reason"),
)
PASSES_INFO = Info(
    "decidealot_passes_info",
    "1 per loaded checkpoint: what its forward passes run through (passes: eager or "
    "compiled) and why (state: off, eager_precision, no_compiler, compiling, compiled, "
    "probe_failed or failed; DECIDEALOT_COMPILE, docs/configuration.md).",
    ("provider", "checkpoint", "passes", "state"),
)
WORKER_STARTS = Counter(
    "decidealot_worker_starts_total",
    "Worker subprocesses that reported healthy, by provider.",
    ("provider",),
)
WORKER_REUSES = Counter(
    "decidealot_worker_reuses_total",
    "Loads that took over an evicted provider's worker process, swapping its engine in place, "
    "by provider.",
    ("provider",),
)
WORKER_RESTARTS = Counter(
    "decidealot_worker_restarts_total",
    "Worker starts that replaced a worker lost to a crash, hang or corrupt output.",
    ("provider",),
)
WORKER_FAILURES = Counter(
    "decidealot_worker_failures_total",
    "Workers lost or refused, by provider and reason: start_failed, exited, timeout or malformed.",
    ("provider", "reason"),
)
ENCODER_FAILURES = Counter(
    "decidealot_encoder_failures_total",
    "Failed calls to CLM's embeddings endpoint (after retries), by reason: timeout, "
    "connection, status or invalid_reply.",
    ("reason",),
)
UPSTREAM_FAILURES = Counter(
    "decidealot_upstream_failures_total",
    "Failed calls to a hosted upstream (Jev's TypeSafe API, after retries), by provider, "
    "upstream route and reason: key_rejected, refused, unavailable, timeout, connection, "
    "invalid_reply or not_started.",
    ("provider", "route", "reason"),
)
REQUESTS_CANCELLED = Counter(
    "decidealot_requests_cancelled_total",
    "Decision requests to local providers whose caller went away (HTTP client disconnected, "
    "MCP request cancelled) before the answer, by provider: their waits ended and their "
    "queued passes were withdrawn.",
    ("provider",),
)
JOBS_WITHDRAWN = Counter(
    "decidealot_jobs_withdrawn_total",
    "Jobs withdrawn from a worker after their caller went away, by provider.",
    ("provider",),
)
ADMISSION_REJECTED = Counter(
    "decidealot_admission_rejected_total",
    "Decision requests answered 503 at once because DECIDEALOT_MAX_PENDING_REQUESTS were "
    "already admitted to local providers.",
)
PENDING_REQUESTS = Gauge(
    "decidealot_pending_requests",
    "Decision requests admitted to local providers and not yet answered.",
)


# -- drift: what the models answer ------------------------------------------------------------

CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0)
"""Probabilities: a choice's can fall to 1/options, a noul's max(p, 1 - p) never below 0.5."""

ANSWER_CONFIDENCE = Histogram(
    "decidealot_answer_confidence",
    "Probability of each answer reported (contract.answer_confidence: probabilities[choice], "
    "a score's nearest level's, a noul's max(p, 1 - p)), by provider, requested model selector "
    "and question type: the number a caller thresholds, so its distribution shows drift.",
    ("provider", "model", "type"),
    buckets=CONFIDENCE_BUCKETS,
)
