"""Jev against a real HTTP server that speaks TypeSafe's published contract (tests/fake_typesafe).

Covers the hosted catalog (auth, 60 s cache on an injected clock, coalesced refresh, malformed
lists), pass-through decisions, retries with Retry-After (each backoff recorded by an injected
sleep, never slept), timeouts, malformed answers, and that
the TypeSafe key never appears in a repr, a log line or an error. Parity with typesafe-sdk
0.7.5: our request body is byte-for-byte what the SDK sends for the same question objects,
and the fake's answers parse with the SDK, so the fake is held to the official client.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import msgspec
import pytest

from decidealot import registry
from decidealot.config import ConfigError
from decidealot.contract import ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneRequest
from decidealot.errors import ProviderUnavailable
from decidealot.protocols import Provider
from decidealot.providers.jev.gateway.client import TypeSafeClient, retry_after_seconds
from decidealot.providers.jev.gateway.provider import (
    MODELS_PATH,
    SYSTEM_ONE_PATH,
    JevProvider,
    encode_request,
)
from tests.support.fake_typesafe import DEFAULT_MODELS, FakeTypeSafe, Fault, answer_request, serve

KEY = "ts-live-Zq8xK3vN9pL2mR7t"  # distinctive, so any leak is found by substring search

REQUEST_DOC: dict[str, Any] = {
    "model": "jev-latest",
    "state": {"message": "Please review the attached invoice.", "amount": 120.5},
    "questions": {
        "queue": {
            "type": "choice",
            "instructions": {"task": "Select the appropriate queue."},
            "criteria": {"billing": "Invoices and payments", "general": None},
        },
        "urgency": {
            "type": "score",
            "criteria": ["Can wait", {"level": "soon"}, ["today", "now"]],
        },
        "urgent": {"type": "noul", "instructions": "Does this need an immediate response?"},
        "spam": {"type": "noul", "criteria": {"true": "Unsolicited advertising", "false": None}},
    },
}


def validated(doc: dict[str, Any] = REQUEST_DOC) -> SystemOneRequest:
    """What the gateway's validator hands a provider for `doc`."""
    return msgspec.json.decode(msgspec.json.encode(doc), type=SystemOneRequest)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Backoff:
    """The client's retry sleep and clock: each delay is recorded instead of slept, and the
    clock counts it, so the retry budget sees the delays as if they had passed."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)  # a suspension point, as a real sleep is

    def clock(self) -> float:
        return time.monotonic() + sum(self.delays)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeTypeSafe]:
    with serve(FakeTypeSafe(api_key=KEY)) as fake:
        yield fake


@pytest.fixture
def typesafe(server: FakeTypeSafe) -> FakeTypeSafe:
    server.api_key = KEY
    server.reset()
    return server


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def backoff() -> Backoff:
    return Backoff()


@pytest.fixture
async def make_provider(
    typesafe: FakeTypeSafe, clock: Clock, backoff: Backoff
) -> AsyncIterator[Callable[..., Any]]:
    """Started providers aimed at the fake, their retry delays recorded in `backoff`; every
    one is closed after the test."""
    providers: list[JevProvider] = []

    async def make(**overrides: Any) -> JevProvider:
        values: dict[str, Any] = {
            "api_key": KEY,
            "base_url": typesafe.url,
            "timeout_seconds": 2.0,
            "retry_seconds": 5.0,
            "sleep": backoff.sleep,
            "clock": backoff.clock,
            **overrides,
        }
        provider = JevProvider(TypeSafeClient(**values), clock=clock)
        await provider.start()
        providers.append(provider)
        return provider

    yield make
    for provider in providers:
        await provider.close()


# -- construction ------------------------------------------------------------------------------


async def test_is_a_hosted_provider_enabled_by_the_key(make_provider: Any) -> None:
    provider = await make_provider()
    assert isinstance(provider, Provider)
    assert (provider.name, provider.local) == ("jev", False)
    jev = registry.descriptor("jev")
    built = jev.build(settings := registry.settings(typesafe_api_key=KEY), jev.of(settings))
    assert isinstance(built, JevProvider) and not jev.local
    with pytest.raises(ConfigError, match="DECIDEALOT_TYPESAFE_API_KEY"):
        jev.build(settings := registry.settings(), jev.of(settings))
    with pytest.raises(ConfigError):
        jev.build(
            settings := registry.settings(typesafe_api_key=KEY, jev_enabled=False), jev.of(settings)
        )


async def test_a_closed_provider_is_unavailable(make_provider: Any) -> None:
    provider = await make_provider()
    await provider.close()
    await provider.close()  # idempotent
    with pytest.raises(ProviderUnavailable):
        await provider.models()


# -- catalog ----------------------------------------------------------------------------------


async def test_lists_typesafe_models_exactly_with_the_bearer_key(
    typesafe: FakeTypeSafe, make_provider: Any
) -> None:
    typesafe.models.append(
        {"name": "Jev-Custom_2", "description": "Case kept.", "release_date": "2026-11-01"}
    )
    provider = await make_provider()
    listed = [msgspec.to_builtins(m) for m in await provider.models()]
    assert listed == typesafe.models
    assert "jev" not in {m["name"] for m in listed}  # no invented alias
    (call,) = typesafe.calls(MODELS_PATH)
    assert call.method == "GET"
    assert call.headers["authorization"] == f"Bearer {KEY}"


async def test_a_rejected_key_makes_listing_and_decisions_unavailable(
    typesafe: FakeTypeSafe, make_provider: Any
) -> None:
    provider = await make_provider(api_key="ts-wrong-key")
    with pytest.raises(ProviderUnavailable):
        await provider.models()
    with pytest.raises(ProviderUnavailable):
        await provider.decide("jev-latest", validated())
    assert len(typesafe.calls(MODELS_PATH)) == 2  # 401 is final: never retried
    assert typesafe.calls(SYSTEM_ONE_PATH) == []


async def test_catalog_is_cached_for_60_seconds_then_refreshed(
    typesafe: FakeTypeSafe, make_provider: Any, clock: Clock
) -> None:
    provider = await make_provider()
    assert provider.status_details() == {"catalog_age_seconds": None}  # /v1/status
    first = await provider.models()
    typesafe.models.append(
        {"name": "jev-2.0.0", "description": "New.", "release_date": "2026-12-01"}
    )
    clock.now += 59.9
    assert await provider.models() == first
    assert provider.status_details() == {"catalog_age_seconds": pytest.approx(59.9)}
    await provider.decide("jev-latest", validated())  # a fresh catalog is not fetched again
    assert len(typesafe.calls(MODELS_PATH)) == 1

    clock.now += 0.1
    assert [m.name for m in await provider.models()][-1] == "jev-2.0.0"
    assert len(typesafe.calls(MODELS_PATH)) == 2

    clock.now += 60.0  # a hosted request refreshes an expired catalog too
    typesafe.models.pop()
    await provider.decide("jev-latest", validated())
    assert len(typesafe.calls(MODELS_PATH)) == 3
    assert [m.name for m in await provider.models()] == [m["name"] for m in DEFAULT_MODELS]


async def test_concurrent_refreshes_share_one_upstream_call(
    typesafe: FakeTypeSafe, make_provider: Any
) -> None:
    provider = await make_provider()
    typesafe.fail_next(MODELS_PATH, Fault(delay=0.3))
    listings = await asyncio.gather(*(provider.models() for _ in range(5)))
    assert all(listing == listings[0] for listing in listings)
    assert len(typesafe.calls(MODELS_PATH)) == 1

    provider = await make_provider()  # a failed refresh fails every waiter, once upstream
    typesafe.fail_next(MODELS_PATH, Fault(status=401, delay=0.3))
    results = await asyncio.gather(*(provider.models() for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, ProviderUnavailable) for r in results)
    assert len(typesafe.calls(MODELS_PATH)) == 2


@pytest.mark.parametrize(
    "body",
    [
        b"<html>not json</html>",
        b"[]",
        b"{}",
        b'{"models": {"name": "jev-latest"}}',
        b'{"models": [{"name": "jev-latest"}]}',
        b'{"models": [{"name": 7, "description": "d", "release_date": "2026-01-01"}]}',
        b'{"models": [{"name": "", "description": "d", "release_date": "2026-01-01"}]}',
    ],
)
async def test_a_malformed_catalog_is_unavailable_until_it_recovers(
    typesafe: FakeTypeSafe, make_provider: Any, body: bytes
) -> None:
    provider = await make_provider()
    typesafe.fail_next(MODELS_PATH, Fault(status=200, body=body))
    with pytest.raises(ProviderUnavailable):
        await provider.models()
    assert len(typesafe.calls(MODELS_PATH)) == 1  # a bad 2xx is final, like the SDK's
    assert len(await provider.models()) == len(DEFAULT_MODELS)  # failures are not cached


# -- decisions --------------------------------------------------------------------------------


async def test_decisions_pass_through_with_the_model_typesafe_reports(
    typesafe: FakeTypeSafe, make_provider: Any
) -> None:
    provider = await make_provider()
    request = validated({**REQUEST_DOC, "config": {}})
    response = await provider.decide("jev-latest", request)

    (call,) = typesafe.calls(SYSTEM_ONE_PATH)
    sent = call.json()
    assert list(sent) == ["state", "model", "questions"]  # config stripped
    assert sent["model"] == "jev-latest"
    assert sent["state"] == REQUEST_DOC["state"]
    assert sent["questions"]["urgent"] == REQUEST_DOC["questions"]["urgent"]
    assert sent["questions"]["spam"]["criteria"] == {
        "true": "Unsolicited advertising",
        "false": None,
    }
    assert "instructions" not in sent["questions"]["urgency"]  # top-level nulls dropped
    assert call.headers["authorization"] == f"Bearer {KEY}"
    assert call.headers["content-type"] == "application/json"

    expected = answer_request(sent, "jev-1.13.0")
    assert msgspec.to_builtins(response) == expected
    assert response.model == "jev-1.13.0"  # the answering model, not the alias sent
    assert isinstance(response.answers["queue"], ChoiceAnswer)
    assert isinstance(response.answers["urgency"], ScoreAnswer)
    assert isinstance(response.answers["urgent"], NoulAnswer)
    assert list(response.answers) == list(REQUEST_DOC["questions"])

    other = validated({**REQUEST_DOC, "state": "A different message."})
    assert msgspec.to_builtins(await provider.decide("jev-preview", other)) != expected


async def test_answers_in_another_order_with_extras_come_back_clean(
    typesafe: FakeTypeSafe, make_provider: Any
) -> None:
    def reorder_and_decorate(answer: dict[str, Any]) -> dict[str, Any]:
        answers = dict(reversed(answer["answers"].items()))
        answers["urgent"]["noul_raw"] = 3.2
        usage = {**answer["usage"], "billing_units": 4}
        return {**answer, "answers": answers, "usage": usage, "routing": {"region": "eu"}}

    typesafe.corrupt = reorder_and_decorate
    response = await (await make_provider()).decide("jev-latest", validated())
    plain = msgspec.to_builtins(response)
    assert list(plain["answers"]) == list(REQUEST_DOC["questions"])
    assert plain["answers"]["urgent"].keys() == {"type", "noul"}
    assert plain.keys() == {"model", "answers", "usage"}
    assert plain["usage"].keys() == {"input_tokens", "output_tokens"}


async def test_large_bodies_travel_zstd_compressed_like_the_sdk(
    typesafe: FakeTypeSafe, make_provider: Any
) -> None:
    request = validated({**REQUEST_DOC, "state": "word " * 400})
    response = await (await make_provider()).decide("jev-latest", request)
    (call,) = typesafe.calls(SYSTEM_ONE_PATH)
    assert call.headers["content-encoding"] == "zstd"
    assert call.body == encode_request("jev-latest", request)
    assert response.model == "jev-1.13.0"


async def test_a_model_typesafe_stopped_listing_is_unavailable_without_a_call(
    typesafe: FakeTypeSafe, make_provider: Any
) -> None:
    provider = await make_provider()
    with pytest.raises(ProviderUnavailable):
        await provider.decide("jev-retired", validated())
    assert typesafe.calls(SYSTEM_ONE_PATH) == []


# -- retries, timeouts and final failures ------------------------------------------------------


async def test_429_waits_for_retry_after_then_succeeds(
    typesafe: FakeTypeSafe, make_provider: Any, backoff: Backoff
) -> None:
    provider = await make_provider()
    await provider.models()
    typesafe.fail_next(SYSTEM_ONE_PATH, Fault(status=429, headers={"Retry-After": "1"}))
    response = await provider.decide("jev-latest", validated())
    assert backoff.delays == [1.0]
    first, second = typesafe.calls(SYSTEM_ONE_PATH)
    assert "x-typesafe-retry-count" not in first.headers
    assert second.headers["x-typesafe-retry-count"] == "1"
    assert first.body == second.body
    assert response.model == "jev-1.13.0"


async def test_5xx_and_retry_after_ms_are_retried_until_success(
    typesafe: FakeTypeSafe, make_provider: Any, backoff: Backoff
) -> None:
    provider = await make_provider()
    await provider.models()
    typesafe.fail_next(
        SYSTEM_ONE_PATH,
        Fault(status=503, headers={"retry-after-ms": "50", "Retry-After": "9"}),
        Fault(status=500),  # no Retry-After: the second attempt's backoff, 1 s less jitter
        Fault(status=408, headers={"retry-after-ms": "20"}),
    )
    response = await provider.decide("jev-latest", validated())
    first, second, third = backoff.delays
    assert first == 0.05  # retry-after-ms won over Retry-After: 9
    assert 0.75 <= second <= 1.0  # 0.5 s doubled once, less up to 25% jitter
    assert third == 0.02
    assert len(typesafe.calls(SYSTEM_ONE_PATH)) == 4
    assert response.answers.keys() == REQUEST_DOC["questions"].keys()


async def test_persistent_5xx_stops_within_the_retry_budget(
    typesafe: FakeTypeSafe, make_provider: Any, backoff: Backoff
) -> None:
    provider = await make_provider(retry_seconds=1.0)
    await provider.models()
    typesafe.persistent[SYSTEM_ONE_PATH] = Fault(status=502)
    with pytest.raises(ProviderUnavailable):
        await provider.decide("jev-latest", validated())
    # 0.5 s less jitter, then no second delay (0.75 s or more) that would end past 1 s
    (delay,) = backoff.delays
    assert 0.375 <= delay <= 0.5
    assert len(typesafe.calls(SYSTEM_ONE_PATH)) == 2


async def test_a_retry_after_beyond_the_budget_fails_at_once(
    typesafe: FakeTypeSafe, make_provider: Any, backoff: Backoff
) -> None:
    provider = await make_provider(retry_seconds=3.0)
    await provider.models()
    typesafe.fail_next(SYSTEM_ONE_PATH, Fault(status=429, headers={"Retry-After": "30"}))
    with pytest.raises(ProviderUnavailable):
        await provider.decide("jev-latest", validated())
    assert backoff.delays == []
    assert len(typesafe.calls(SYSTEM_ONE_PATH)) == 1


async def test_timeouts_are_retried_then_unavailable(
    typesafe: FakeTypeSafe, make_provider: Any, backoff: Backoff
) -> None:
    provider = await make_provider(timeout_seconds=0.2, retry_seconds=1.5)
    await provider.models()
    typesafe.persistent[SYSTEM_ONE_PATH] = Fault(delay=3.0)  # slower than the 0.2 s timeout
    with pytest.raises(ProviderUnavailable):
        await provider.decide("jev-latest", validated())
    # two 0.2 s timeouts and one backoff (0.5 s less jitter) spent ~0.8 s of the 1.5 s: a
    # second delay (0.75 s or more) would end past it
    (delay,) = backoff.delays
    assert 0.375 <= delay <= 0.5
    assert len(typesafe.calls(SYSTEM_ONE_PATH)) == 2

    typesafe.persistent[SYSTEM_ONE_PATH] = None
    typesafe.fail_next(SYSTEM_ONE_PATH, Fault(delay=3.0))  # one slow answer, then a good one
    assert (await provider.decide("jev-latest", validated())).model == "jev-1.13.0"


async def test_connection_errors_are_unavailable(make_provider: Any) -> None:
    with closed_port() as url:
        provider = await make_provider(base_url=url, retry_seconds=0.0)
        with pytest.raises(ProviderUnavailable):
            await provider.models()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
async def test_final_statuses_are_unavailable_without_retry(
    typesafe: FakeTypeSafe, make_provider: Any, status: int
) -> None:
    provider = await make_provider()
    await provider.models()
    typesafe.fail_next(SYSTEM_ONE_PATH, Fault(status=status))
    with pytest.raises(ProviderUnavailable):
        await provider.decide("jev-latest", validated())
    assert len(typesafe.calls(SYSTEM_ONE_PATH)) == 1


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def corrupt(answer: dict[str, Any]) -> dict[str, Any]:
        target = answer
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return answer

    return corrupt


def _drop(*path: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def corrupt(answer: dict[str, Any]) -> dict[str, Any]:
        target = answer
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return answer

    return corrupt


MALFORMED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "not an object": lambda a: [a],
    "model missing": _drop("model"),
    "model empty": _set(("model",), ""),
    "model null": _set(("model",), None),
    "answer missing": _drop("answers", "spam"),
    "answer for an unasked question": _set(("answers", "extra"), {"type": "noul", "noul": 0.5}),
    "answers empty": _set(("answers",), {}),
    "answers as a list": lambda a: {**a, "answers": list(a["answers"].values())},
    "wrong answer type": _set(("answers", "urgent"), {"type": "choice", "choice": "x"}),
    "unknown answer type": _set(("answers", "urgent"), {"type": "box", "confidence": None}),
    "noul above 1": _set(("answers", "urgent", "noul"), 1.5),
    "noul as string": _set(("answers", "urgent", "noul"), "0.5"),
    "choice outside labels": _set(("answers", "queue", "choice"), "other"),
    "choice probabilities miss a label": _drop("answers", "queue", "probabilities", "general"),
    "choice probability negative": _set(("answers", "queue", "probabilities", "billing"), -0.1),
    "choice without confidence": _drop("answers", "queue", "confidence"),
    "confidence above 1": _set(("answers", "queue", "confidence"), 1.01),
    "score legend keyed from 1": _set(
        ("answers", "urgency", "legend"), {"1": "a", "2": "b", "3": "c"}
    ),
    "score legend as list": _set(("answers", "urgency", "legend"), ["a", "b", "c"]),
    "score legend missing": _drop("answers", "urgency", "legend"),
    "score probabilities short": _drop("answers", "urgency", "probabilities", "2"),
    "score past the last level": _set(("answers", "urgency", "score"), 2.5),
    "usage missing": _drop("usage"),
    "usage float": _set(("usage", "input_tokens"), 1.0),
    "usage negative": _set(("usage", "output_tokens"), -1),
    "usage string": _set(("usage", "input_tokens"), "12"),
}


@pytest.mark.parametrize("corrupt", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_answers_are_unavailable(
    typesafe: FakeTypeSafe, make_provider: Any, corrupt: Callable[[dict[str, Any]], Any]
) -> None:
    provider = await make_provider()
    typesafe.corrupt = corrupt
    with pytest.raises(ProviderUnavailable) as raised:
        await provider.decide("jev-latest", validated())
    assert raised.value.details == {}
    assert len(typesafe.calls(SYSTEM_ONE_PATH)) == 1  # a bad 2xx is not retried


async def test_a_non_json_answer_is_unavailable(typesafe: FakeTypeSafe, make_provider: Any) -> None:
    provider = await make_provider()
    typesafe.fail_next(SYSTEM_ONE_PATH, Fault(status=200, body=b"Internal Server Error"))
    with pytest.raises(ProviderUnavailable):
        await provider.decide("jev-latest", validated())


# -- the key never leaks ----------------------------------------------------------------------


async def test_the_key_never_appears_in_reprs_logs_or_errors(
    typesafe: FakeTypeSafe, make_provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore included
    settings = registry.settings(typesafe_api_key=KEY, typesafe_base_url=typesafe.url)
    provider = await make_provider(retry_seconds=0.6)
    texts = [repr(settings), str(settings), repr(provider), str(provider)]
    texts += [repr(vars(provider)), repr(vars(provider._client))]

    await provider.decide("jev-latest", validated())
    errors: list[ProviderUnavailable] = []
    # Upstream bodies that echo the key: a 5xx with retries, then a malformed 2xx.
    for fault in (
        Fault(status=500, body=f'{{"detail": "{KEY}"}}'.encode()),
        Fault(status=200, body=f'{{"model": "{KEY}"}}'.encode()),
    ):
        typesafe.persistent[SYSTEM_ONE_PATH] = fault
        with pytest.raises(ProviderUnavailable) as raised:
            await provider.decide("jev-latest", validated())
        errors.append(raised.value)
    typesafe.api_key = "ts-rotated-key"  # the fake's 401 body echoes the key it refused
    refused = await make_provider()
    with pytest.raises(ProviderUnavailable) as raised:
        await refused.models()
    errors.append(raised.value)

    for error in errors:
        assert error.message == "the selected provider is unavailable"
        assert error.details == {}
        texts += [str(error), repr(error), "".join(traceback.format_exception(error))]
    texts += [record.getMessage() for record in caplog.records]
    texts.append(caplog.text)
    assert any("rejected" in t for t in texts)  # the operator still learns why
    assert all(KEY not in text for text in texts)


# -- parity with typesafe-sdk 0.7.5 ------------------------------------------------------------


async def test_request_body_is_what_the_sdk_sends_and_the_sdk_parses_the_answers(
    typesafe: FakeTypeSafe,
) -> None:
    sdk = pytest.importorskip("typesafe_sdk")
    questions = {
        "queue": sdk.Choice(
            instructions={"task": "Select the appropriate queue."},
            criteria={"billing": "Invoices and payments", "general": None},
        ),
        "urgency": sdk.Score(criteria=["Can wait", {"level": "soon"}, ["today", "now"]]),
        "urgent": sdk.Noul(instructions="Does this need an immediate response?"),
        "spam": sdk.Noul(criteria={"true": "Unsolicited advertising", "false": None}),
    }
    async with sdk.AsyncTypeSafeClient(
        api_key=KEY,
        base_url=typesafe.url,
        compression=False,
        retry=sdk.RetryPolicy(max_retries=0),
    ) as client:
        parsed = await client.system_one(
            REQUEST_DOC["state"], questions, model=REQUEST_DOC["model"]
        )
    (call,) = typesafe.calls(SYSTEM_ONE_PATH)
    assert call.body == encode_request("jev-latest", validated())
    assert parsed.model == "jev-1.13.0"
    assert set(parsed.answers) == set(REQUEST_DOC["questions"])
    assert parsed.usage.input_tokens > 0

    async with sdk.AsyncTypeSafeClient(api_key=KEY, base_url=typesafe.url) as client:
        listed = await client.models.list()
    assert [m.name for m in listed.models] == [m["name"] for m in DEFAULT_MODELS]


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "-5", "retry-after": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a past date: no wait
        ({"retry-after": "-1"}, None),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_parsing_matches_the_sdk(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert retry_after_seconds(httpx.Headers(headers)) == seconds
    sdk_errors = pytest.importorskip("typesafe_sdk._core.errors")
    httpx2 = pytest.importorskip("httpx2")
    sdk_ms = sdk_errors.parse_retry_after(httpx2.Headers(headers))
    assert (None if sdk_ms is None else sdk_ms / 1000) == seconds


@contextmanager
def closed_port() -> Iterator[str]:
    """A loopback URL nobody listens on: the port is bound but never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
