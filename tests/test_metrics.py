"""The metrics registry and its exposition, checked with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from decidealot import metrics
from decidealot.config import Settings
from decidealot.contract import NoulQuestion
from decidealot.errors import ProviderUnavailable
from decidealot.metrics import Registry, format_value
from decidealot.residency import Residency
from providers.clm.encoder_client import EncoderClient
from providers.engine import EngineSpec, Job
from providers.jev.client import TypeSafeClient
from providers.local import WorkerRuntime
from tests.test_providers import FakeRuntime


def parse(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def arith_job(state: str, **config: object) -> Job:
    return Job("ckpt", state, {"q": NoulQuestion()}, config=dict(config))


def test_counters_with_labels_parse_back() -> None:
    registry = Registry()
    requests = registry.counter("x_requests_total", "Requests.", ("route", "status"))
    requests.inc(route="/v1/systemone", status="200")
    requests.inc(2, route="/v1/systemone", status="200")
    requests.inc(route="/health", status="503")
    text = registry.render()
    family = parse(text)["x_requests"]
    assert family.type == "counter"
    assert family.documentation == "Requests."
    got = samples(text)
    assert got[("x_requests_total", (("route", "/v1/systemone"), ("status", "200")))] == 3
    assert got[("x_requests_total", (("route", "/health"), ("status", "503")))] == 1
    assert requests.value(route="/health", status="503") == 1


def test_counters_only_go_up_and_labels_must_match() -> None:
    counter = Registry().counter("c_total", "C.", ("a",))
    with pytest.raises(ValueError, match="cannot go down"):
        counter.inc(-1, a="x")
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc(b="x")
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc()


def test_label_values_and_help_are_escaped() -> None:
    registry = Registry()
    gauge = registry.gauge("g", 'Help with \\ and\nnewline "quoted".', ("name",))
    awkward = 'a "quoted" back\\slash\nnew line'
    gauge.set(1.5, name=awkward)
    text = registry.render()
    assert text.count("\n") == 3  # HELP, TYPE, one sample: no raw newline leaked
    family = parse(text)["g"]
    assert family.documentation == 'Help with \\ and\nnewline "quoted".'
    assert family.samples[0].labels == {"name": awkward}
    assert family.samples[0].value == 1.5


def test_gauges_set_and_move() -> None:
    registry = Registry()
    loaded = registry.gauge("loaded", "Loaded.", ("provider",))
    in_flight = registry.gauge("in_flight", "Now.")
    in_flight.inc()
    in_flight.inc()
    in_flight.dec()
    loaded.set(1, provider="laya")
    loaded.set(0, provider="von")
    got = samples(registry.render())
    assert got[("in_flight", ())] == 1
    assert got[("loaded", (("provider", "laya"),))] == 1
    assert got[("loaded", (("provider", "von"),))] == 0
    loaded.set(0, provider="laya")
    assert loaded.value(provider="laya") == 0


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    registry = Registry()
    latency = registry.histogram("pass_seconds", "Pass.", ("provider",), buckets=(0.1, 1, 10))
    for value in (0.05, 0.1, 0.5, 3, 100):
        latency.observe(value, provider="laya")
    latency.observe(2, provider="von")
    text = registry.render()
    family = parse(text)["pass_seconds"]
    assert family.type == "histogram"
    got = samples(text)

    def bucket(le: str, provider: str = "laya") -> float:
        return got[("pass_seconds_bucket", (("le", le), ("provider", provider)))]

    assert [bucket(le) for le in ("0.1", "1", "10", "+Inf")] == [2, 3, 4, 5]
    assert got[("pass_seconds_count", (("provider", "laya"),))] == 5
    assert got[("pass_seconds_sum", (("provider", "laya"),))] == pytest.approx(103.65)
    assert bucket("+Inf", "von") == 1 and bucket("1", "von") == 0
    assert latency.count(provider="laya") == 5
    assert latency.total(provider="von") == 2


def test_histograms_refuse_le_labels_and_empty_buckets() -> None:
    registry = Registry()
    with pytest.raises(ValueError, match="reserved"):
        registry.histogram("h", "H.", ("le",))
    with pytest.raises(ValueError, match="distinct"):
        registry.histogram("h2", "H.", buckets=())
    with pytest.raises(ValueError, match="already registered"):
        registry.counter("h3_total", "H.")
        registry.counter("h3_total", "H.")


def test_values_are_formatted_as_the_format_spells_them() -> None:
    assert format_value(3.0) == "3"
    assert format_value(0.25) == "0.25"
    assert format_value(math.inf) == "+Inf"
    assert format_value(-math.inf) == "-Inf"
    assert format_value(math.nan) == "NaN"
    assert format_value(1e300) == "1e+300"


def test_the_service_registry_is_valid_exposition() -> None:
    text = metrics.REGISTRY.render()
    families = parse(text)
    assert "decidealot_http_requests" in families
    assert "decidealot_forward_pass_seconds" in families
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))
    assert all(name.startswith("decidealot_") for name in names)
    counters = [line.split()[2] for line in text.splitlines() if line.endswith(" counter")]
    assert all(name.endswith("_total") for name in counters)


# -- the hooks in residency, the worker runtime and the upstream clients -------------------------


async def test_residency_counts_loads_and_each_kind_of_unload() -> None:
    residency = Residency(Settings(max_resident_providers=1, provider_idle_unload_seconds=0.1))
    first, second = FakeRuntime("metrics-first"), FakeRuntime("metrics-second")
    residency.register(first)
    residency.register(second)
    await residency.start()
    unloads = metrics.PROVIDER_UNLOADS

    async with residency.use(first):
        pass
    async with residency.use(second):  # one slot: the first makes room
        pass
    assert unloads.value(provider="metrics-first", reason="evicted") == 1
    await residency.unload_all()
    assert unloads.value(provider="metrics-second", reason="unload_all") == 1
    async with residency.use(first):
        pass
    await asyncio.sleep(0.4)
    assert unloads.value(provider="metrics-first", reason="idle") == 1
    async with residency.use(second):
        pass
    await residency.close()
    assert unloads.value(provider="metrics-second", reason="shutdown") == 1
    assert metrics.PROVIDER_LOADS.value(provider="metrics-first", result="ok") == 2
    assert metrics.PROVIDER_LOADS.value(provider="metrics-second", result="ok") == 2
    assert metrics.PROVIDER_LOAD_DURATION.count(provider="metrics-first") == 2


async def test_worker_passes_batch_sizes_failures_and_restarts() -> None:
    name = "metrics-arith"
    spec = EngineSpec(factory="tests.engines.arith:create", checkpoints={})
    runtime = WorkerRuntime(name, spec, Settings(device="cpu"))
    try:
        await runtime.load()
        first = asyncio.create_task(runtime.submit(arith_job("slow", sleep=0.5)))
        await asyncio.sleep(0.2)  # the next three queue behind the slow pass and share one
        rest = [runtime.submit(arith_job(f"job {i}")) for i in range(3)]
        await asyncio.gather(first, *rest)
        assert metrics.BATCH_SIZE.count(provider=name) == 2
        assert metrics.BATCH_SIZE.total(provider=name) == 4
        assert metrics.FORWARD_PASS.count(provider=name) == 2
        assert metrics.FORWARD_PASS.total(provider=name) >= 0.5
        assert metrics.BATCH_TOKENS.total(provider=name) > 0

        with pytest.raises(ProviderUnavailable):
            await runtime.submit(arith_job("dies", crash="run"))
        assert metrics.WORKER_FAILURES.value(provider=name, reason="exited") == 1
        assert metrics.WORKER_RESTARTS.value(provider=name) == 0
        await runtime.load()
        assert metrics.WORKER_RESTARTS.value(provider=name) == 1
        assert metrics.WORKER_STARTS.value(provider=name) == 2
        await runtime.unload()
        await runtime.load()  # after a plain unload: a start, not a restart
        assert metrics.WORKER_RESTARTS.value(provider=name) == 1
    finally:
        await runtime.unload()

    broken = EngineSpec(
        factory="tests.engines.arith:create", checkpoints={}, options={"fail_start": True}
    )
    refused = WorkerRuntime("metrics-broken", broken, Settings(device="cpu"))
    with pytest.raises(ProviderUnavailable):
        await refused.load()
    assert metrics.WORKER_FAILURES.value(provider="metrics-broken", reason="start_failed") == 1


async def test_encoder_and_upstream_failures_are_counted() -> None:
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
    encoder = EncoderClient(closed + "/v1", "qwen", width=4, retry_seconds=0)
    before = metrics.ENCODER_FAILURES.value(reason="connection")
    with pytest.raises(ProviderUnavailable):
        await encoder.embed(["text"], cache=False)
    await encoder.close()
    assert metrics.ENCODER_FAILURES.value(reason="connection") == before + 1

    typesafe = TypeSafeClient(base_url=closed, api_key="k", timeout_seconds=1, retry_seconds=0)
    await typesafe.start()
    failures = {"provider": "jev", "route": "/v1/models", "reason": "connection"}
    before = metrics.UPSTREAM_FAILURES.value(**failures)
    with pytest.raises(ProviderUnavailable):
        await typesafe.get("/v1/models", bytes)
    await typesafe.close()
    assert metrics.UPSTREAM_FAILURES.value(**failures) == before + 1
