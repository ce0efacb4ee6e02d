"""The CLM provider against a real loopback embeddings server: cache accounting, encoder
failures, the text-byte bound, key hygiene and wiring. The head runs in process, and once
in a real worker under real residency."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest

from decidealot import registry
from decidealot.catalog import Route, Routed
from decidealot.contract import (
    ChoiceQuestion,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
)
from decidealot.errors import ProviderUnavailable, RequestInvalid
from decidealot.executor import Executor
from decidealot.providers.clm.descriptor import SELECTORS
from decidealot.providers.clm.gateway.encoder_client import EncoderClient, embeddings_endpoint
from decidealot.providers.clm.gateway.provider import ClmProvider
from decidealot.providers.clm.render import render_questions
from decidealot.providers.clm.tiny import build_clm_head
from decidealot.residency import Residency
from decidealot.service import Service, build_providers, lane_of
from tests.support.checkpoints import TinyCheckpoints
from tests.support.clm_runner import clm_runtime
from tests.support.decide import Deciding, through_service
from tests.support.fake_embeddings import FakeEmbeddings, fake_tokens

WIDTH = 16
SECRET = "sk-test-secret-0123456789"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings(WIDTH, slow_seconds=1.0).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def head(tiny: TinyCheckpoints) -> Path:
    return tiny.clm(hidden=WIDTH)


@pytest.fixture
async def make_provider(fake: FakeEmbeddings, head: Path) -> AsyncIterator[object]:
    """Providers over the fake endpoint; encoder retries are off unless a test asks, and their
    backoffs are recorded in `make.backoff` instead of slept."""
    fake.reset()
    clients: list[EncoderClient] = []
    backoff: list[float] = []

    async def record(seconds: float) -> None:
        backoff.append(seconds)

    def make(*, max_text_bytes: int = 8192, **encoder: object) -> Deciding:
        options: dict[str, object] = {
            "retry_seconds": 0.0,
            "timeout_seconds": 5.0,
            "sleep": record,
            **encoder,
        }
        client = EncoderClient(fake.url, "qwen3-8b", width=WIDTH, **options)  # type: ignore[arg-type]
        clients.append(client)
        runtime = clm_runtime(head, width=WIDTH)
        return Deciding(
            ClmProvider(client, runtime, selectors=SELECTORS, max_text_bytes=max_text_bytes)
        )

    make.backoff = backoff  # type: ignore[attr-defined]
    yield make
    for client in clients:
        await client.close()
    fake.reset()


def _request(
    option: str = "Payment or refund question", temperature: float | None = None
) -> SystemOneRequest:
    return SystemOneRequest(
        model="clm",
        state={"customer": "Ana", "message": "I was charged twice"},
        questions={
            "queue": ChoiceQuestion(
                instructions="Route payment questions to billing.",
                criteria={"billing": option, "technical": "Software failure", "other": None},
            ),
            "urgent": NoulQuestion(instructions="Does this need an immediate response?"),
        },
        config={} if temperature is None else {"temperature": temperature},
    )


def _texts(request: SystemOneRequest) -> tuple[list[str], list[str]]:
    rendered = [r for _, r in render_questions(request.state, request.questions)]
    states = list(dict.fromkeys(r.state_text for r in rendered))
    options = list(dict.fromkeys(c.text for r in rendered for c in r.candidates))
    return states, options


def _tokens(texts: list[str]) -> int:
    return sum(fake_tokens(t) for t in texts)


async def test_models_lists_the_four_selectors(make_provider) -> None:
    provider = make_provider()
    models = await provider.models()
    assert [m.name for m in models] == ["clm", "clm-latest", "clm-0.1", "clm-0.1-8b"]
    assert models == list(registry.descriptor("clm").selectors)
    assert provider.name == "clm" and provider.local is True


async def test_cache_hits_lower_input_tokens_exactly(make_provider, fake: FakeEmbeddings) -> None:
    provider = make_provider()
    first = _request()
    states, options = _texts(first)

    cold = await provider.decide("clm", first)
    assert cold.usage.input_tokens == _tokens(states) + _tokens(options)
    assert fake.calls == [states, options]

    fake.calls.clear()
    warm = await provider.decide("clm-latest", first)
    assert warm.usage.input_tokens == _tokens(states)  # state vectors are always requested
    assert fake.calls == [states]
    assert msgspec.to_builtins(warm.answers) == msgspec.to_builtins(cold.answers)

    fake.calls.clear()
    changed = _request(option="Refund or duplicate charge")
    partial = await provider.decide("clm", changed)
    assert fake.calls == [states, ["Refund or duplicate charge"]]
    assert partial.usage.input_tokens == _tokens(states) + fake_tokens("Refund or duplicate charge")
    assert partial.usage.output_tokens == 0


async def test_cached_candidates_expire_after_the_ttl(make_provider, fake: FakeEmbeddings) -> None:
    now = [1000.0]
    provider = make_provider(cache_ttl_seconds=60, clock=lambda: now[0])
    request = _request()
    states, options = _texts(request)
    await provider.decide("clm", request)
    now[0] += 59.9
    fake.calls.clear()
    await provider.decide("clm", request)
    assert fake.calls == [states]  # the candidates are still cached
    now[0] += 0.1
    fake.calls.clear()
    again = await provider.decide("clm", request)
    assert fake.calls == [states, options]
    assert again.usage.input_tokens == _tokens(states) + _tokens(options)


async def test_cache_capacity_is_bounded(make_provider, fake: FakeEmbeddings) -> None:
    provider = make_provider(cache_size=2)
    request = _request()
    _, options = _texts(request)
    await provider.decide("clm", request)
    fake.calls.clear()
    await provider.decide("clm", request)
    assert len(fake.calls[1]) == len(options) - 2  # only two candidates stayed cached


async def test_temperature_sharpens_probabilities(make_provider) -> None:
    provider = make_provider()
    cool = await provider.decide("clm", _request(temperature=0.2))
    warm = await provider.decide("clm", _request(temperature=5.0))
    assert max(cool.answers["queue"].probabilities.values()) > max(
        warm.answers["queue"].probabilities.values()
    )


async def test_float_list_and_base64_answers_agree(make_provider, fake: FakeEmbeddings) -> None:
    base64_answer = await make_provider(cache_size=0).decide("clm", _request())
    fake.force_encoding = "float"
    float_answer = await make_provider(cache_size=0).decide("clm", _request())
    assert msgspec.to_builtins(float_answer) == msgspec.to_builtins(base64_answer)


@pytest.mark.parametrize(
    "failure", ["down", "slow", "wrong_width", "nan", "bad_base64", "error500"]
)
async def test_encoder_failures_are_unavailable_then_recover(
    failure: str, make_provider, fake: FakeEmbeddings, caplog: pytest.LogCaptureFixture
) -> None:
    provider = make_provider(timeout_seconds=0.3, api_key=SECRET)
    assert provider.status_details() == {"encoder_answered_last_call": None}  # no call yet
    if failure == "down":
        fake.stop()
    else:
        fake.mode = failure  # type: ignore[assignment]
    with caplog.at_level(logging.DEBUG), pytest.raises(ProviderUnavailable) as raised:
        await provider.decide("clm", _request())
    assert raised.value.status == 503
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert SECRET not in str(raised.value) and SECRET not in caplog.text
    assert "CLM encoder call failed" in caplog.text
    assert provider.status_details() == {"encoder_answered_last_call": False}  # /v1/status

    if failure == "down":
        fake.start()
    fake.mode = "ok"
    recovered = await provider.decide("clm", _request())
    assert set(recovered.answers) == {"queue", "urgent"}
    assert provider.status_details() == {"encoder_answered_last_call": True}


async def test_transient_errors_are_retried_within_the_budget(
    make_provider, fake: FakeEmbeddings
) -> None:
    provider = make_provider(retry_seconds=5.0)
    fake.mode, fake.failures_left = "error500", 2
    response = await provider.decide("clm", _request())
    states, options = _texts(_request())
    assert fake.calls == [states, states, states, options]
    assert response.usage.input_tokens == _tokens(states) + _tokens(options)
    assert make_provider.backoff == [0.1, 0.2]  # exponential, recorded instead of slept


@pytest.mark.parametrize("mode", ["nan", "bad_base64"])
async def test_invalid_vectors_are_not_retried(
    make_provider, fake: FakeEmbeddings, mode: str
) -> None:
    provider = make_provider(retry_seconds=5.0)
    fake.mode = mode  # type: ignore[assignment]
    with pytest.raises(ProviderUnavailable):
        await provider.decide("clm", _request())
    assert len(fake.calls) == 1 and make_provider.backoff == []


async def test_api_key_is_sent_but_never_shown(make_provider, fake: FakeEmbeddings) -> None:
    provider = make_provider(api_key=SECRET)
    await provider.decide("clm", _request())
    assert fake.auth_headers == [f"Bearer {SECRET}"] * 2
    assert fake.paths == ["/v1/embeddings"] * 2
    assert SECRET not in repr(provider.encoder) and SECRET not in repr(provider)


def test_endpoint_url_rules() -> None:
    assert embeddings_endpoint("http://e:8090") == "http://e:8090/v1/embeddings"
    assert embeddings_endpoint("http://e:8090/") == "http://e:8090/v1/embeddings"
    assert embeddings_endpoint("http://e/v1") == "http://e/v1/embeddings"
    assert embeddings_endpoint("http://e/v1/embeddings") == "http://e/v1/embeddings"
    assert embeddings_endpoint("https://e/proxy/embeddings/") == "https://e/proxy/embeddings"


# -- the text-byte bound ---------------------------------------------------------------------


async def test_state_over_the_byte_limit_is_a_422_before_any_encoder_call(
    make_provider, fake: FakeEmbeddings
) -> None:
    question = NoulQuestion(instructions="Urgent?")
    at_limit = "é" * 46  # 92 bytes + "\n\nUrgent?" (9) = 101 > 100
    provider = make_provider(max_text_bytes=100)
    request = SystemOneRequest(model="clm", state=at_limit, questions={"urgent": question})
    with pytest.raises(RequestInvalid) as raised:
        await provider.decide("clm", request)
    (issue,) = raised.value.issues
    assert issue.loc == ["questions", "urgent"]
    assert "101 UTF-8 bytes" in issue.msg and "at most 100" in issue.msg
    assert fake.calls == []

    fits = SystemOneRequest(model="clm", state="é" * 45 + "a", questions={"urgent": question})
    await make_provider(max_text_bytes=100).decide("clm", fits)  # exactly 100 bytes


@pytest.mark.parametrize(
    ("question", "loc"),
    [
        (ChoiceQuestion(criteria={"billing": "x" * 65, "tech": None}), ["criteria", "billing"]),
        (ChoiceQuestion(criteria={"k" * 65: None}), ["criteria", "k" * 65]),
        (ScoreQuestion(criteria=["low", {"detail": "y" * 60}]), ["criteria", 1]),
        (NoulQuestion(criteria={"true": ["z" * 60]}), ["criteria", "true"]),
        (NoulQuestion(instructions="w" * 50), ["instructions"]),
    ],
)
async def test_option_over_the_byte_limit_names_its_field(
    question: object, loc: list[object], make_provider, fake: FakeEmbeddings
) -> None:
    provider = make_provider(max_text_bytes=64)
    request = SystemOneRequest(model="clm", state="s", questions={"q": question})  # type: ignore[dict-item]
    with pytest.raises(RequestInvalid) as raised:
        await provider.decide("clm", request)
    (issue,) = raised.value.issues
    assert issue.loc == ["questions", "q", *loc]
    assert fake.calls == []


async def test_single_level_score_answers_with_certainty(make_provider) -> None:
    request = SystemOneRequest(
        model="clm", state="s", questions={"only": ScoreQuestion(criteria=[{"level": "fine"}])}
    )
    answer = (await make_provider().decide("clm", request)).answers["only"]
    assert answer == ScoreAnswer(
        score=0.0, confidence=1.0, legend={"0": "level: fine"}, probabilities={"0": 1.0}
    )


# -- wiring ----------------------------------------------------------------------------------


@pytest.mark.parametrize("in_lane", [True, False])
async def test_the_executor_runs_the_encoder_calls_inside_the_hold_unless_parallel(
    make_provider, fake: FakeEmbeddings, in_lane: bool
) -> None:
    deciding = make_provider()
    provider: ClmProvider = deciding.provider
    provider.in_lane = in_lane
    residency = Residency(registry.settings(provider_idle_unload_seconds=0))
    residency.register(provider.runtime, "local", "clm")
    holding: dict[str, int] = {}
    accept, embed = provider.accept, provider.encoder.embed

    async def watched_accept(selector: str, request: SystemOneRequest) -> object:
        holding["prepare"] = residency.ledger.holding("clm")  # decisions inside the hold now
        return await accept(selector, request)

    async def watched_embed(*args: object, **options: object) -> object:
        holding["encoder"] = residency.ledger.holding("clm")
        return await embed(*args, **options)  # type: ignore[arg-type]

    provider.accept = watched_accept  # type: ignore[method-assign]
    provider.encoder.embed = watched_embed  # type: ignore[method-assign]
    routed = Routed(_request(), Route(provider, "clm"))
    response = (await Executor(residency, ["clm"]).decide(routed)).body
    assert set(response.answers) == {"queue", "urgent"} and len(fake.calls) == 2
    # bounds are checked before any wait; the encoder calls keep to the lane unless parallel
    assert holding == {"prepare": 0, "encoder": 1 if in_lane else 0}
    await residency.close()


def test_gateway_modules_do_not_import_torch() -> None:
    code = (
        "import sys, decidealot.providers.clm.gateway.provider, "
        "decidealot.providers.clm.gateway.encoder_client, "
        "decidealot.providers.clm.encoder_server; "
        "assert not {'torch', 'transformers', 'sentence_transformers'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


@pytest.mark.parametrize(
    ("parallel", "device", "lane"),
    [
        (False, "cpu", ("local", "clm")),
        (False, "cuda", ("cuda", "clm")),
        (True, "cuda", (None, "clm")),
        (True, "cpu", (None, "clm")),
    ],
)
async def test_the_service_builds_the_worker_spec_and_lane(
    parallel: bool, device: str, lane: tuple[str | None, str], tmp_path: Path
) -> None:
    settings = registry.settings(
        clm_embeddings_url="http://127.0.0.1:9/v1",
        model_dir=tmp_path,
        device=device,  # type: ignore[arg-type]
        clm_parallel_with_local_models=parallel,
        laya_enabled=False,
        von_enabled=False,
    )
    (provider,) = build_providers(settings)
    assert isinstance(provider, ClmProvider)
    assert provider.in_lane is not parallel
    runtime = provider.runtime
    assert lane_of("clm", runtime, settings) == lane
    spec = runtime.spec  # type: ignore[attr-defined]
    assert spec.factory == "decidealot.providers.clm.worker.engine:create"
    head = tmp_path / "clm-0.1-8b" / "CLM_v0.1-8B.pt"
    assert spec.checkpoints == {"clm-0.1-8b": str(head)}
    assert spec.options == {"width": 4096} and spec.preload == ["clm-0.1-8b"]
    assert provider.encoder.width == 4096
    await provider.close()


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
async def test_production_wiring_runs_the_head_in_a_worker(tmp_path: Path) -> None:
    """from_settings as served: 4096-wide vectors, a real worker process, real residency."""
    wide = FakeEmbeddings(4096).start()
    settings = registry.settings(
        clm_embeddings_url=wide.url,
        clm_head=(
            head := build_clm_head(tmp_path / "wide.pt", hidden=4096, width=24, proj=8, seed=9)
        ),
        model_dir=tmp_path,
        device="cpu",
        torch_threads=1,
        provider_idle_unload_seconds=0,
    )
    service = Service(registry.replace(settings, laya_enabled=False, von_enabled=False))
    in_process = Deciding(
        ClmProvider(
            EncoderClient(wide.url, "qwen3-8b", width=4096),
            clm_runtime(head, width=4096),
            selectors=SELECTORS,
            max_text_bytes=8192,
        )
    )
    try:
        await service.start()
        served = await through_service(service, _request(temperature=0.7))
        expected = await in_process.decide("clm", _request(temperature=0.7))
        assert msgspec.to_builtins(served) == msgspec.to_builtins(expected)
        assert service.residency.loaded("clm")
    finally:
        await service.close()
        await in_process.close()
        wide.stop()
    assert not service.residency.loaded("clm")
