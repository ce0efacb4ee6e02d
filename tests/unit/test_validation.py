"""Validation through the production app in-process (Litestar's test client): every rejection
is a 422 TypeSafe envelope naming the field."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.app import GATEWAY, InProcessApp, app_fixture

gateway = app_fixture("gateway", **GATEWAY)

NOUL = {"type": "noul", "instructions": "Is it urgent?"}


def body(**overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "von", "state": "s", "questions": {"q": NOUL}}
    request.update(overrides)
    return {k: v for k, v in request.items() if v is not ...}


def post(app: InProcessApp, payload: Any, path: str = "/v1/systemone") -> httpx.Response:
    return app.client.post(path, json=payload)


def issues(response: httpx.Response) -> list[tuple[list[Any], str]]:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    for issue in detail:
        assert set(issue) == {"loc", "msg", "type", "input"}
        assert issue["msg"]
    return [(issue["loc"], issue["type"]) for issue in detail]


CASES: list[tuple[str, dict[str, Any], list[tuple[list[Any], str]]]] = [
    ("missing everything", {}, [(["body", "model"], "missing"), (["body", "state"], "missing"),
                                (["body", "questions"], "missing")]),
    ("unknown top-level field", body(temperature=0.5),
     [(["body", "temperature"], "extra_forbidden")]),
    ("assets refused", body(assets={"a": {"type": "image"}}),
     [(["body", "assets"], "value_error")]),
    ("model not a string", body(model=3), [(["body", "model"], "string_type")]),
    ("state a number", body(state=3), [(["body", "state"], "json_type")]),
    ("state null", body(state=None), [(["body", "state"], "json_type")]),
    ("questions empty", body(questions={}), [(["body", "questions"], "too_short")]),
    ("questions a list", body(questions=[NOUL]), [(["body", "questions"], "dict_type")]),
    ("question not an object", body(questions={"q": "noul"}),
     [(["body", "questions", "q"], "model_attributes_type")]),
    ("question without type", body(questions={"q": {"instructions": "x"}}),
     [(["body", "questions", "q"], "union_tag_not_found")]),
    ("unknown question type", body(questions={"q": {"type": "rank"}}),
     [(["body", "questions", "q"], "union_tag_invalid")]),
    ("box refused", body(questions={"q": {"type": "box", "instructions": "dog"}}),
     [(["body", "questions", "q", "type"], "value_error")]),
    ("unknown question field", body(questions={"q": {**NOUL, "weight": 2}}),
     [(["body", "questions", "q", "noul", "weight"], "extra_forbidden")]),
    ("instructions a number", body(questions={"q": {"type": "noul", "instructions": 4}}),
     [(["body", "questions", "q", "noul", "instructions"], "json_type")]),
    ("choice without criteria", body(questions={"q": {"type": "choice"}}),
     [(["body", "questions", "q", "choice", "criteria"], "missing")]),
    ("choice with no options", body(questions={"q": {"type": "choice", "criteria": {}}}),
     [(["body", "questions", "q", "choice", "criteria"], "too_short")]),
    ("choice with 256 options",
     body(questions={"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}}),
     [(["body", "questions", "q", "choice", "criteria"], "too_long")]),
    ("choice option a number", body(questions={"q": {"type": "choice", "criteria": {"a": 1}}}),
     [(["body", "questions", "q", "choice", "criteria", "a"], "json_type")]),
    ("choice criteria a list", body(questions={"q": {"type": "choice", "criteria": ["a"]}}),
     [(["body", "questions", "q", "choice", "criteria"], "dict_type")]),
    ("score with one level", body(questions={"urgency": {"type": "score", "criteria": ["low"]}}),
     [(["body", "questions", "urgency", "score", "criteria"], "too_short")]),
    ("score with 11 levels",
     body(questions={"q": {"type": "score", "criteria": list("abcdefghijk")}}),
     [(["body", "questions", "q", "score", "criteria"], "too_long")]),
    ("score level null", body(questions={"q": {"type": "score", "criteria": ["a", None]}}),
     [(["body", "questions", "q", "score", "criteria", 1], "json_type")]),
    ("score criteria an object", body(questions={"q": {"type": "score", "criteria": {"a": 1}}}),
     [(["body", "questions", "q", "score", "criteria"], "list_type")]),
    ("noul criteria other key", body(questions={"q": {"type": "noul", "criteria": {"yes": "a"}}}),
     [(["body", "questions", "q", "noul", "criteria", "yes"], "extra_forbidden")]),
    ("noul criteria a string", body(questions={"q": {"type": "noul", "criteria": "a"}}),
     [(["body", "questions", "q", "noul", "criteria"], "dict_type")]),
    ("empty question name", body(questions={"": NOUL}),
     [(["body", "questions", "", "[key]"], "string_too_short")]),
    ("question name too long", body(questions={"x" * 129: NOUL}),
     [(["body", "questions", "x" * 129, "[key]"], "string_too_long")]),
    ("1025 questions", body(questions={f"q{i}": NOUL for i in range(1025)}),
     [(["body", "questions"], "too_long")]),
    ("config on von", body(config={"temperature": 0.5}),
     [(["body", "config", "temperature"], "extra_forbidden")]),
    ("config null", body(config=None), [(["body", "config"], "dict_type")]),
    ("config a list", body(config=[]), [(["body", "config"], "dict_type")]),
    ("clm temperature zero", body(model="clm", config={"temperature": 0}),
     [(["body", "config", "temperature"], "greater_than")]),
    ("clm temperature over 100", body(model="clm", config={"temperature": 100.5}),
     [(["body", "config", "temperature"], "less_than_equal")]),
    ("clm temperature boolean", body(model="clm", config={"temperature": True}),
     [(["body", "config", "temperature"], "float_type")]),
    ("clm temperature string", body(model="clm", config={"temperature": "0.8"}),
     [(["body", "config", "temperature"], "float_type")]),
    ("clm temperature null", body(model="clm", config={"temperature": None}),
     [(["body", "config", "temperature"], "float_type")]),
    ("clm unknown config key", body(model="clm", config={"top_k": 3}),
     [(["body", "config", "top_k"], "extra_forbidden")]),
    ("unknown model", body(model="unknown-model"), [(["body", "model"], "value_error")]),
]  # fmt: skip


@pytest.mark.parametrize(("payload", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejections_name_the_field(
    gateway: InProcessApp, payload: dict[str, Any], expected: list[tuple[list[Any], str]]
) -> None:
    assert issues(post(gateway, payload)) == expected


def test_every_issue_is_reported_at_once(gateway: InProcessApp) -> None:
    payload = {
        "model": "von",
        "state": 1,
        "questions": {
            "urgency": {"type": "score", "criteria": ["only"]},
            "route": {"type": "choice", "criteria": {"a": 1}, "extra": True},
            "ok": NOUL,
        },
        "config": {"temperature": 1},
    }
    assert issues(post(gateway, payload)) == [
        (["body", "state"], "json_type"),
        (["body", "questions", "urgency", "score", "criteria"], "too_short"),
        (["body", "questions", "route", "choice", "extra"], "extra_forbidden"),
        (["body", "questions", "route", "choice", "criteria", "a"], "json_type"),
        (["body", "config", "temperature"], "extra_forbidden"),
    ]


def test_unknown_model_message_is_the_contracts(gateway: InProcessApp) -> None:
    payload = {
        "model": "unknown-model",
        "state": "anything",
        "questions": {"answer": {"type": "noul"}},
    }
    response = post(gateway, payload)
    assert response.status_code == 422
    assert response.json() == {
        "detail": [
            {
                "loc": ["body", "model"],
                "msg": "Value error, unknown model 'unknown-model'; "
                "use a name returned by GET /v1/models",
                "type": "value_error",
                "input": "unknown-model",
            }
        ]
    }


def test_typesafe_value_shapes_are_accepted(gateway: InProcessApp) -> None:
    """TypeSafe's schema: instructions/criteria may be string, object, array or null."""
    payload = {
        "model": "von",
        "state": {"message": "NaN", "nested": [1, {"a": None}]},
        "questions": {
            "a": {"type": "noul"},
            "b": {"type": "noul", "instructions": None, "criteria": {"true": "yes"}},
            "c": {"type": "noul", "criteria": {"false": {"k": "v"}, "true": None}},
            "d": {"type": "noul", "criteria": None},
            "e": {"type": "choice", "instructions": {"task": "x"}, "criteria": {"x": None}},
            "f": {"type": "choice", "criteria": {"x": ["a"], "y": {"b": 1}, "z": "s"}},
            "g": {"type": "score", "instructions": ["a"], "criteria": ["a", {"b": 2}, ["c"]]},
        },
        "config": {},
    }
    response = post(gateway, payload)
    assert response.status_code == 200, response.text
    assert list(response.json()["answers"]) == list("abcdefg")


def test_the_largest_accepted_shapes(gateway: InProcessApp) -> None:
    options = {f"option-{i}": None for i in range(255)}
    questions = {f"q{i}": NOUL for i in range(1023)}
    questions["x" * 128] = {"type": "choice", "criteria": options}
    response = post(gateway, body(questions=questions))
    assert response.status_code == 200, response.text[:500]
    assert len(response.json()["answers"]) == 1024


def test_clm_accepts_a_temperature(gateway: InProcessApp) -> None:
    for temperature in (0.8, 100, 1e-9):
        response = post(gateway, body(model="clm", config={"temperature": temperature}))
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "clm-0.1-8b"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"model": "von",', "Expecting"),
        (b'{"model": "von", "state": NaN, "questions": {}}', "NaN"),
        (b'{"model": "von", "model": "laya", "state": "s", "questions": {}}', "duplicate"),
        (b'{"model": "von", "state": "\xff", "questions": {}}', "UTF-8"),
        (b'{"model": "von", "state": "\\ud800", "questions": {}}', "surrogate"),
        (b'{"model": "von", "state": "s", "questions": {},}', "Expecting"),
        (b'{"state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"model": "von", "state": [1e999], "questions": {}}', "out of range"),
        (b'{"model": "von", "state": [18446744073709551616], "questions": {}}', "64 bits"),
    ],
    ids=[
        "truncated",
        "nan",
        "duplicate-key",
        "bad-utf8",
        "lone-surrogate",
        "trailing-comma",
        "deep-nesting",
        "float-overflow",
        "int-over-64-bits",
    ],
)
def test_malformed_json(gateway: InProcessApp, raw: bytes, reason: str) -> None:
    response = gateway.client.post(
        "/v1/systemone", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    [issue] = response.json()["detail"]
    assert issue["type"] == "json_invalid"
    assert issue["loc"][0] == "body"
    assert reason in issue["msg"]


def test_validation_errors_never_echo_the_state(gateway: InProcessApp) -> None:
    secret = "s3cret-state-contents"
    response = post(gateway, {"state": {"x": secret}, "questions": {}})
    assert response.status_code == 422
    assert secret not in response.text


def test_batch_items_are_validated_with_their_index(gateway: InProcessApp) -> None:
    payload = {
        "requests": [
            body(state={"fake": {"tag": "must-not-run"}}),
            body(model="clm", config={"temperature": -1}),
            body(questions={"urgency": {"type": "score", "criteria": ["a"]}}),
            body(model="nope"),
        ]
    }
    assert issues(post(gateway, payload, "/v1/systemone/batch")) == [
        (["body", "requests", 1, "config", "temperature"], "greater_than"),
        (["body", "requests", 2, "questions", "urgency", "score", "criteria"], "too_short"),
        (["body", "requests", 3, "model"], "value_error"),
    ]
    assert all(event["tag"] != "must-not-run" for event in gateway.events())


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({}, [(["body", "requests"], "missing")]),
        ({"requests": []}, [(["body", "requests"], "too_short")]),
        ({"requests": {}}, [(["body", "requests"], "list_type")]),
        ({"requests": [body()] * 9}, [(["body", "requests"], "too_long")]),
        ({"requests": [body()], "parallel": True}, [(["body", "parallel"], "extra_forbidden")]),
        ({"requests": [3]}, [(["body", "requests", 0], "dict_type")]),
    ],
    ids=["missing", "empty", "not-a-list", "over-max-batch-requests", "extra-field", "item-type"],
)
def test_batch_envelope(gateway: InProcessApp, payload: Any, expected: Any) -> None:
    assert issues(post(gateway, payload, "/v1/systemone/batch")) == expected
