"""The official typesafe-sdk client (zstd compression on) against the gateway over HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest
from typesafe_sdk import (
    Box,
    Choice,
    Image,
    Noul,
    RetryPolicy,
    Score,
    TypeSafeAPIError,
    TypeSafeAuthenticationError,
    TypeSafeClient,
    TypeSafeUnprocessableEntityError,
)

from tests.support.servers import RunningServer

PNG = bytes.fromhex("89504e470d0a1a0a") + b"\x00" * 64


@pytest.fixture
def sent() -> list[httpx2.Request]:
    return []


@pytest.fixture
def client(gateway: RunningServer, sent: list[httpx2.Request]) -> Iterator[TypeSafeClient]:
    http = httpx2.Client(event_hooks={"request": [sent.append]})
    with TypeSafeClient(
        api_key="any-key",
        base_url=gateway.url,
        compression="zstd",
        retry=RetryPolicy(max_retries=0),
        http_client=http,
    ) as sdk:
        yield sdk


def questions() -> dict[str, Any]:
    return {
        "billing": Noul(instructions="Is this about billing?"),
        "spam": Noul(criteria={"true": "Unsolicited advertising"}),
        "tone": Choice(instructions="What is the tone?", criteria={"calm": None, "angry": "Upset"}),
        "urgency": Score(
            instructions="How urgent is this message?",
            criteria=["Can wait", "Needs attention this week", "Needs attention today"],
        ),
    }


def test_models_list(client: TypeSafeClient) -> None:
    names = [m.name for m in client.models.list().models]
    assert names[:2] == ["laya", "laya-auto"]
    assert "jev-latest" in names


@pytest.mark.parametrize("model", ["laya", "von-1.1", "clm", "jev-latest", None])
def test_system_one_with_compressed_bodies(
    client: TypeSafeClient, sent: list[httpx2.Request], model: str | None
) -> None:
    state = {"message": "I was charged twice. " * 100, "amount": "NaN"}  # > 1 KiB: zstd
    result = client.system_one(state=state, questions=questions(), model=model)
    assert sent[-1].headers["content-encoding"] == "zstd"
    assert set(result.answers) == {"billing", "spam", "tone", "urgency"}
    assert result.choices["tone"].choice in {"calm", "angry"}
    assert 0 <= result.nouls["billing"].noul <= 1
    assert set(result.scores["urgency"].legend) == {0, 1, 2}
    assert result.usage.output_tokens == 0
    assert result.request_id  # from x-typesafe-request-id
    assert result.model == {"laya": "laya-english", "von-1.1": "von-1.1", "clm": "clm-0.1-8b"}.get(
        model or "jev-latest", "jev-latest"
    )


def test_small_bodies_go_uncompressed(client: TypeSafeClient, sent: list[httpx2.Request]) -> None:
    client.system_one(state="short", questions={"q": Noul(instructions="?")}, model="von")
    assert "content-encoding" not in sent[-1].headers


def test_clm_temperature_through_extra_body(client: TypeSafeClient) -> None:
    result = client.system_one(
        state="refund",
        questions=questions(),
        model="clm",
        extra_body={"config": {"temperature": 0.8}},
    )
    assert result.model == "clm-0.1-8b"


def test_validation_errors_reach_the_sdk_user(client: TypeSafeClient) -> None:
    with pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(state="x" * 2000, questions=questions(), model="nope")
    assert "model: Value error, unknown model 'nope'" in str(raised.value)
    with pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(
            state="x", questions={"q": {"type": "score", "criteria": ["one"]}}, model="von"
        )
    assert "questions.q.score.criteria" in str(raised.value)


def test_box_questions_are_refused_clearly(client: TypeSafeClient) -> None:
    with pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(
            state="a photo", questions={"dog": Box(instructions="the dog")}, model="von"
        )
    assert "box questions are not supported" in str(raised.value)


def test_image_assets_are_refused_clearly(
    client: TypeSafeClient, sent: list[httpx2.Request]
) -> None:
    with pytest.raises(TypeSafeAPIError) as raised:
        client.system_one(
            state="What is in <image:photo>?",
            questions={"q": Noul(instructions="Is there a dog?")},
            model="von",
            assets={"photo": Image(PNG * 40)},
        )
    assert raised.value.status == 415
    assert "image assets" in str(raised.value)
    assert sent[-1].headers["content-encoding"] == "zstd"


def test_wrong_key_is_an_authentication_error(launch: Callable[..., RunningServer]) -> None:
    server = launch(DECIDEALOT_API_KEY="right-key")
    with TypeSafeClient(api_key="wrong-key", base_url=server.url, compression="zstd") as sdk:
        with pytest.raises(TypeSafeAuthenticationError) as raised:
            sdk.models.list()
        assert "a valid bearer token is required" in str(raised.value)
    with TypeSafeClient(api_key="right-key", base_url=server.url, compression="zstd") as sdk:
        assert sdk.system_one(state="s" * 2000, questions=questions(), model="von").answers
