"""The metrics on prometheus_client: its metrics with label values as keywords, the service's
exposition at `/metrics` of the production app in-process (parsed with prometheus_client's own
parser, names and labels as docs/operations.md lists them), and the hooks in residency, the
worker runtime and the upstream clients."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from decidealot import metrics, registry
from decidealot.contract import NoulQuestion
from decidealot.errors import ProviderUnavailable
from decidealot.jobs import EngineSpec, Job
from decidealot.metrics import Counter, Gauge, Histogram, Info, ServiceCollector
from decidealot.providers.clm.gateway.encoder_client import EncoderClient
from decidealot.providers.engine.client import ProcessRuntime
from decidealot.providers.jev.gateway.client import TypeSafeClient
from decidealot.residency import Residency
from tests.support.app import GATEWAY, in_process
from tests.support.fakes import FakeRuntime

OPERATIONS_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
_DOC_ROW = re.compile(r"^\| `(decidealot_\w+)` \| (\w+) \|([^|]*)\|", re.MULTILINE)


def parse(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def value(name: str, **labels: str) -> float:
    """A sample of the process's registry now (0 before its first observation)."""
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def unloads(**labels: str) -> float:
    return value("decidealot_provider_unloads_total", **labels)


def arith_job(state: str, **config: object) -> Job:
    return Job("ckpt", state, {"q": NoulQuestion()}, config=dict(config))


def test_counters_with_labels_parse_back() -> None:
    registry = CollectorRegistry()
    requests = Counter("x_requests_total", "Requests.", ("route", "status"), registry=registry)
    requests.inc(route="/v1/systemone", status="200")
    requests.inc(2, route="/v1/systemone", status="200")
    requests.inc(route="/health", status="503")
    text = render(registry)
    family = parse(text)["x_requests"]
    assert family.type == "counter"
    assert family.documentation == "Requests."
    got = samples(text)
    assert got[("x_requests_total", (("route", "/v1/systemone"), ("status", "200")))] == 3
    assert got[("x_requests_total", (("route", "/health"), ("status", "503")))] == 1
    assert not any(name.endswith("_created") for name, _ in got)


def test_counters_only_go_up_and_labels_must_match() -> None:
    counter = Counter("c_total", "C.", ("a",), registry=CollectorRegistry())
    with pytest.raises(ValueError):
        counter.inc(-1, a="x")
    with pytest.raises(ValueError):
        counter.inc(b="x")
    with pytest.raises(ValueError):
        counter.inc()


def test_label_values_and_help_are_escaped() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("g", 'Help with \\ and\nnewline "quoted".', ("name",), registry=registry)
    awkward = 'a "quoted" back\\slash\nnew line'
    gauge.set(1.5, name=awkward)
    text = render(registry)
    assert text.count("\n") == 3  # HELP, TYPE, one sample: no raw newline leaked
    family = parse(text)["g"]
    assert family.documentation == 'Help with \\ and\nnewline "quoted".'
    assert family.samples[0].labels == {"name": awkward}
    assert family.samples[0].value == 1.5


def test_gauges_set_and_move() -> None:
    registry = CollectorRegistry()
    loaded = Gauge("loaded", "Loaded.", ("provider",), registry=registry)
    in_flight = Gauge("in_flight", "Now.", registry=registry)
    in_flight.inc()
    in_flight.inc()
    in_flight.dec()
    loaded.set(1, provider="laya")
    loaded.set(0, provider="von")
    got = samples(render(registry))
    assert got[("in_flight", ())] == 1
    assert got[("loaded", (("provider", "laya"),))] == 1
    assert got[("loaded", (("provider", "von"),))] == 0


def test_gauge_series_are_removed_by_some_of_their_labels() -> None:
    registry = CollectorRegistry()
    share = Gauge("share", "Share.", ("provider", "checkpoint"), registry=registry)
    share.set(0.5, provider="laya", checkpoint="english")
    share.set(1, provider="laya", checkpoint="multilingual")
    share.remove(provider="laya", checkpoint="english")
    share.remove(provider="von", checkpoint="never-set")  # no error
    assert samples(render(registry)) == {
        ("share", (("checkpoint", "multilingual"), ("provider", "laya"))): 1
    }
    share.remove(provider="laya")
    assert samples(render(registry)) == {}


def test_an_info_keeps_one_series_per_checkpoint() -> None:
    registry = CollectorRegistry()
    info = Info("info", "Info.", ("provider", "checkpoint", "precision"), registry=registry)
    info.set(provider="laya", checkpoint="english", precision="bf16")
    info.set(provider="laya", checkpoint="english", precision="fp32")
    info.set(provider="von", checkpoint="von-1.1", precision="fp32")
    assert samples(render(registry)) == {
        ("info", (("checkpoint", "english"), ("precision", "fp32"), ("provider", "laya"))): 1,
        ("info", (("checkpoint", "von-1.1"), ("precision", "fp32"), ("provider", "von"))): 1,
    }


def test_the_service_metrics_are_in_the_private_registry_only() -> None:
    from prometheus_client import REGISTRY as GLOBAL

    assert metrics.REGISTRY.get_sample_value("decidealot_pending_requests") is not None
    assert GLOBAL.get_sample_value("decidealot_pending_requests") is None


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    registry = CollectorRegistry()
    latency = Histogram(
        "pass_seconds", "Pass.", ("provider",), buckets=(0.1, 1, 10), registry=registry
    )
    for observed in (0.05, 0.1, 0.5, 3, 100):
        latency.observe(observed, provider="laya")
    latency.observe(2, provider="von")
    text = render(registry)
    family = parse(text)["pass_seconds"]
    assert family.type == "histogram"
    got = samples(text)

    def bucket(le: str, provider: str = "laya") -> float:
        return got[("pass_seconds_bucket", (("le", le), ("provider", provider)))]

    assert [bucket(le) for le in ("0.1", "1.0", "10.0", "+Inf")] == [2, 3, 4, 5]
    assert got[("pass_seconds_count", (("provider", "laya"),))] == 5
    assert got[("pass_seconds_sum", (("provider", "laya"),))] == pytest.approx(103.65)
    assert bucket("+Inf", "von") == 1 and bucket("1.0", "von") == 0


def test_each_service_reports_its_own_scrape_time_gauges() -> None:
    """Two services in one process share the process's metrics, not their loaded gauges."""

    class Loaded:
        def __init__(self, **state: bool) -> None:
            self.state = state

        @property
        def names(self) -> list[str]:
            return list(self.state)

        def loaded(self, name: str) -> bool:
            return self.state[name]

    first, second = Loaded(laya=True, von=False), Loaded(clm=True)
    one = samples(ServiceCollector(first).render().decode())
    two = samples(ServiceCollector(second).render().decode())
    loaded = "decidealot_provider_loaded"
    assert {labels: v for (name, labels), v in one.items() if name == loaded} == {
        (("provider", "laya"),): 1,
        (("provider", "von"),): 0,
    }
    assert {labels: v for (name, labels), v in two.items() if name == loaded} == {
        (("provider", "clm"),): 1
    }
    first.state["laya"] = False  # read at scrape time, not when the collector was made
    assert (
        samples(ServiceCollector(first).render().decode())[(loaded, (("provider", "laya"),))] == 0
    )


def test_the_queue_gauges_read_the_ledger_at_scrape_time() -> None:
    """Queued (waiting for a slot), running (holding one) and the oldest queued one's age, per
    provider, from the ledger's own claims; the open connections from the counter given."""
    from decidealot.ledger import Ledger

    class Loaded:
        names = ("laya", "von")

        def loaded(self, name: str) -> bool:
            return True

    ledger = Ledger()
    collector = ServiceCollector(Loaded(), ledger, lambda: 7)

    read = ("decisions_queued", "decisions_running", "decisions_queued_oldest_seconds")
    read += ("open_connections",)

    def gauges() -> dict[tuple[str, str], float]:
        return {
            (name.removeprefix("decidealot_"), dict(labels).get("provider", "")): value
            for (name, labels), value in samples(collector.render().decode()).items()
            if name.removeprefix("decidealot_") in read
        }

    assert gauges() == {
        ("decisions_queued", "laya"): 0,
        ("decisions_queued", "von"): 0,
        ("decisions_running", "laya"): 0,
        ("decisions_running", "von"): 0,
        ("decisions_queued_oldest_seconds", "laya"): 0,
        ("decisions_queued_oldest_seconds", "von"): 0,
        ("open_connections", ""): 7,
    }
    with ledger.claim("laya") as first, ledger.claim("laya"), ledger.claim("von") as von:
        first.since -= 30  # queued half a minute ago
        von.hold()
        now = gauges()
        assert now[("decisions_queued", "laya")] == 2
        assert now[("decisions_running", "von")] == 1
        assert 30 <= now[("decisions_queued_oldest_seconds", "laya")] < 40
        assert now[("decisions_queued_oldest_seconds", "von")] == 0
        first.hold()  # the oldest now is the second claim, queued just now
        assert gauges()[("decisions_queued_oldest_seconds", "laya")] < 10
        assert gauges()[("decisions_running", "laya")] == 1
    assert {k: v for k, v in gauges().items() if k[0] != "open_connections"} == dict.fromkeys(
        [(gauge, provider) for gauge in read[:3] for provider in ("laya", "von")], 0.0
    )


def test_served_metrics_have_the_documented_names_and_the_process_metrics(
    tmp_path: Path,
) -> None:
    """Served by the app at /metrics: every metric docs/operations.md lists, with its type and
    labels, plus prometheus_client's standard process metrics, in the 0.0.4 text format."""
    decision = {"model": "von", "state": "s", "questions": {"q": {"type": "noul"}}}
    with in_process(tmp_path, **GATEWAY) as gateway:
        assert gateway.client.post("/v1/systemone", json=decision).status_code == 200
        response = gateway.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = parse(response.text)
    documented = _DOC_ROW.findall(OPERATIONS_DOC.read_text())
    served = {name for name in families if name.startswith("decidealot_")}
    assert {name.removesuffix("_total") for name, _, _ in documented} == served
    for name, kind, labels in documented:
        family = families[name.removesuffix("_total")]
        assert family.type == kind, name
        expected = set(re.findall(r"`(\w+)`", labels))
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == expected, (name, sample.labels)
    decided = [s for s in families["decidealot_decisions"].samples if s.labels["model"] == "von"]
    assert decided and all(s.labels["provider"] == "von" for s in decided)
    loaded = {s.labels["provider"] for s in families["decidealot_provider_loaded"].samples}
    assert {"laya", "von", "clm"} <= loaded
    memory = families["process_resident_memory_bytes"].samples[0].value
    assert memory > 1_000_000
    assert families["process_open_fds"].samples[0].value > 0
    assert "python_info" in families


# -- the hooks in residency, the worker runtime and the upstream clients -------------------------


async def test_residency_counts_loads_and_each_kind_of_unload() -> None:
    residency = Residency(
        registry.settings(max_resident_providers=1, provider_idle_unload_seconds=0.1)
    )
    first, second = FakeRuntime("metrics-first"), FakeRuntime("metrics-second")
    residency.register(first)
    residency.register(second)
    await residency.start()

    async with residency.use(first):
        pass
    async with residency.use(second):  # one slot: the first makes room
        pass
    assert unloads(provider="metrics-first", reason="evicted") == 1
    await residency.unload_all()
    assert unloads(provider="metrics-second", reason="unload_all") == 1
    idle_unloaded = asyncio.Event()
    unload = first.unload

    async def unload_and_tell() -> None:
        await unload()
        idle_unloaded.set()

    first.unload = unload_and_tell
    async with residency.use(first):
        pass
    await asyncio.wait_for(idle_unloaded.wait(), 10)  # the idle reaper's unload, not a guess
    assert unloads(provider="metrics-first", reason="idle") == 1
    async with residency.use(second):
        pass
    await residency.close()
    assert unloads(provider="metrics-second", reason="shutdown") == 1
    assert value("decidealot_provider_loads_total", provider="metrics-first", result="ok") == 2
    assert value("decidealot_provider_loads_total", provider="metrics-second", result="ok") == 2
    assert value("decidealot_provider_load_seconds_count", provider="metrics-first") == 2


async def test_worker_passes_batch_sizes_failures_and_restarts(tmp_path: Path) -> None:
    name = "metrics-arith"
    log = tmp_path / "passes"
    spec = EngineSpec(
        factory="tests.support.engines.arith:create", checkpoints={}, options={"log": str(log)}
    )
    runtime = ProcessRuntime(name, spec, registry.settings(device="cpu"))
    try:
        await runtime.load()
        first = asyncio.create_task(runtime.submit(arith_job("slow", sleep=0.5)))
        # the next three queue behind the slow pass and share one: sent once it has begun
        async with asyncio.timeout(30):  # a hang guard only
            while '"size"' not in (log.read_text() if log.exists() else ""):
                await asyncio.sleep(0.02)
        rest = [runtime.submit(arith_job(f"job {i}")) for i in range(3)]
        await asyncio.gather(first, *rest)
        assert value("decidealot_batch_size_count", provider=name) == 2
        assert value("decidealot_batch_size_sum", provider=name) == 4
        assert value("decidealot_forward_pass_seconds_count", provider=name) == 2
        assert value("decidealot_forward_pass_seconds_sum", provider=name) >= 0.5
        assert value("decidealot_batch_tokens_sum", provider=name) > 0

        with pytest.raises(ProviderUnavailable):
            await runtime.submit(arith_job("dies", crash="run"))
        assert value("decidealot_worker_failures_total", provider=name, reason="exited") == 1
        assert value("decidealot_worker_restarts_total", provider=name) == 0
        await runtime.load()
        assert value("decidealot_worker_restarts_total", provider=name) == 1
        assert value("decidealot_worker_starts_total", provider=name) == 2
        await runtime.unload()
        await runtime.load()  # after a plain unload: a start, not a restart
        assert value("decidealot_worker_restarts_total", provider=name) == 1
    finally:
        await runtime.unload()

    broken = EngineSpec(
        factory="tests.support.engines.arith:create", checkpoints={}, options={"fail_start": True}
    )
    refused = ProcessRuntime("metrics-broken", broken, registry.settings(device="cpu"))
    with pytest.raises(ProviderUnavailable):
        await refused.load()
    failed = {"provider": "metrics-broken", "reason": "start_failed"}
    assert value("decidealot_worker_failures_total", **failed) == 1


async def test_encoder_and_upstream_failures_are_counted() -> None:
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
    encoder = EncoderClient(closed + "/v1", "qwen", width=4, retry_seconds=0)
    before = value("decidealot_encoder_failures_total", reason="connection")
    with pytest.raises(ProviderUnavailable):
        await encoder.embed(["text"], cache=False)
    await encoder.close()
    assert value("decidealot_encoder_failures_total", reason="connection") == before + 1

    typesafe = TypeSafeClient(base_url=closed, api_key="k", timeout_seconds=1, retry_seconds=0)
    await typesafe.start()
    failures = {"provider": "jev", "route": "/v1/models", "reason": "connection"}
    before = value("decidealot_upstream_failures_total", **failures)
    with pytest.raises(ProviderUnavailable):
        await typesafe.call("GET", "/v1/models", bytes)
    await typesafe.close()
    assert value("decidealot_upstream_failures_total", **failures) == before + 1
