"""Long states over the real `decidealot serve` on the tiny Laya checkpoints, in each
`DECIDEALOT_LONG_STATES` mode, against upstream laya 0.4.15 in this process.

`cut` (the default): the `Decidealot-Truncated` header (an RFC 8941 list of sf-strings, one per
question cut, with `read` and `total`, and `item` on a batch) says what `system_one`'s usage
says; MCP results carry the same in `_meta["decidealot/truncated"]`; the counter and an info log
line without the state's text. `refuse`: 422 at the state before any pass, over HTTP and MCP.
`windows`: `predict_long`'s answers and `usage.input_tokens`, its rows bounded by
`DECIDEALOT_MAX_REQUEST_TOKENS` like any others; Von, which has no windows, cuts and reports as
under `cut`, as von-sdk does. Every server runs fp32, as parity does (`auto` may run bf16).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from decidealot.contract import Answer
from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.mcp_clients import over_http, over_stdio, tool_outcome
from tests.support.servers import RunningServer, start_server
from tests.support.von_answers import assert_same

laya = pytest.importorskip("laya")

HEADER = "Decidealot-Truncated"
META = "decidealot/truncated"
SECRET = "zebra-ledger"
"""A word of every long state, which no log line may carry."""
QUESTIONS: dict[str, dict[str, Any]] = {
    "queue": {
        "type": "choice",
        "instructions": "Route the ticket.",
        "criteria": {"billing": "A payment or refund", "shipping": None},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["routine", "important", "urgent"],
    },
    "review": {"type": "noul", "instructions": "Is human review needed?"},
}
SHORT = "The customer was charged twice."
VON_STATE = f"{SECRET} " + "The refund for order 84213 was sent twice. " * 1200
"""Past Von's 8192-token window: cut in the middle."""
VON_QUESTIONS = {
    "late": {"type": "noul", "instructions": "Was the payment sent twice?"},
    "queue": QUESTIONS["queue"],
}
WINDOWS_BOUND = 1500
"""`DECIDEALOT_MAX_REQUEST_TOKENS` of the windows server: an 80-word state's windows cost more
(the tiny tokenizer makes about 3.4 tokens of a word; one row holds at most 128)."""


def long_state(words: int, tag: str = "") -> str:
    vocabulary = ["refund", "payment", "the", "customer", "is", "and", "account", "urgent", tag]
    return " ".join([SECRET, *(vocabulary[i % len(vocabulary)] for i in range(words))]).strip()


def request(state: Any, questions: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"model": "laya-english", "state": state, "questions": questions or QUESTIONS}


def parse_truncated(value: str) -> list[dict[str, Any]]:
    """An RFC 8941 list whose members are sf-strings with integer parameters, strictly: each
    member as `{"question", **params}`; anything else fails the test."""
    member = re.compile(
        r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"'  # an sf-string
        r"((?:;[a-z*][a-z0-9_.*-]*=-?\d{1,15})*)"  # integer parameters
    )
    parsed, rest = [], value
    while True:
        match = member.match(rest)
        assert match is not None, value
        entry: dict[str, Any] = {"question": re.sub(r"\\(.)", r"\1", match.group(1))}
        for param in filter(None, match.group(2).split(";")):
            key, number = param.split("=")
            entry[key] = int(number)
        parsed.append(entry)
        rest = rest[match.end() :]
        if not rest:
            return parsed
        separator = re.match(r"[ \t]*,[ \t]*", rest)
        assert separator is not None and separator.end() < len(rest), value
        rest = rest[separator.end() :]


def post(server: RunningServer, path: str, body: object) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


@pytest.fixture(scope="module")
def paths(tiny: TinyCheckpoints) -> dict[str, Path]:
    return tiny.laya_all()


@pytest.fixture(scope="module")
def agent(paths: dict[str, Path]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the shipped choice:11+ clamp warning
        return laya.load(str(paths["english"]), device="cpu")


def _serve(folder: Path, paths: dict[str, Path], **env: str) -> Iterator[RunningServer]:
    """`decidealot serve` on the tiny Laya checkpoints (Von off unless `env` says)."""
    settings = {
        "DECIDEALOT_DEVICE": "cpu",
        "DECIDEALOT_TORCH_THREADS": "1",
        "DECIDEALOT_PRECISION": "fp32",
        "DECIDEALOT_VON_ENABLED": "false",
        **laya_settings(paths),
    }
    server = start_server(folder, launcher="decidealot", args=("serve",), **(settings | env))
    yield server
    assert server.stop(30) == 0


@pytest.fixture(scope="module")
def von_path(tiny: TinyCheckpoints) -> Path:
    """A tiny Von whose positions reach past the 8192-token window."""
    return tiny.von(size="long", independent_options=False, digit_split=False, seed=3)


@pytest.fixture(scope="module")
def von_sdk(von_path: Path) -> Any:
    """von-sdk's evaluation of `VON_STATE`, as Decidealot serves Von: chains off, the raw noul
    decision, the checkpoint's own calibration, its default 8192-token state limit."""
    from von.backends.option_marker_backend import OptionMarkerBackend

    with pytest.MonkeyPatch.context() as env:
        for name, value in {"VON_CHAINS_DIR": "off", "VON_NOUL_DECISION": "raw"}.items():
            env.setenv(name, value)
        for name in ("VON_CALIBRATION", "VON_MAX_STATE_TOKENS", "VON_ON_OVERFLOW"):
            env.delenv(name, raising=False)
        upstream = OptionMarkerBackend(checkpoint_dir=str(von_path), device="cpu")
        upstream._get_model()  # reads the environment as it loads
    theirs = upstream.evaluate(VON_STATE, VON_QUESTIONS)
    assert theirs.truncation is not None
    return theirs


@pytest.fixture(scope="module")
def cut(
    tmp_path_factory: pytest.TempPathFactory, paths: dict[str, Path], von_path: Path
) -> Iterator[RunningServer]:
    """The default mode: no setting; Laya and Von."""
    von = {"DECIDEALOT_VON_ENABLED": "true", "DECIDEALOT_VON_CHECKPOINT": str(von_path)}
    yield from _serve(tmp_path_factory.mktemp("cut"), paths, **von)


@pytest.fixture(scope="module")
def refuse(
    tmp_path_factory: pytest.TempPathFactory, paths: dict[str, Path], von_path: Path
) -> Iterator[RunningServer]:
    """Laya and Von, refusing."""
    von = {"DECIDEALOT_VON_ENABLED": "true", "DECIDEALOT_VON_CHECKPOINT": str(von_path)}
    folder = tmp_path_factory.mktemp("refuse")
    yield from _serve(folder, paths, DECIDEALOT_LONG_STATES="refuse", **von)


@pytest.fixture(scope="module")
def von_windows(
    tmp_path_factory: pytest.TempPathFactory, paths: dict[str, Path], von_path: Path
) -> Iterator[RunningServer]:
    """Laya and Von under `windows`, at the default request token bound (a Von state past its
    window costs more than `WINDOWS_BOUND`)."""
    von = {"DECIDEALOT_VON_ENABLED": "true", "DECIDEALOT_VON_CHECKPOINT": str(von_path)}
    folder = tmp_path_factory.mktemp("von-windows")
    yield from _serve(folder, paths, DECIDEALOT_LONG_STATES="windows", **von)


@pytest.fixture(scope="module")
def windows(
    tmp_path_factory: pytest.TempPathFactory, paths: dict[str, Path]
) -> Iterator[RunningServer]:
    yield from _serve(
        tmp_path_factory.mktemp("windows"),
        paths,
        DECIDEALOT_LONG_STATES="windows",
        DECIDEALOT_MAX_REQUEST_TOKENS=str(WINDOWS_BOUND),
    )


def expected_cuts(agent: Any, state: Any, questions: dict[str, Any]) -> dict[str, int]:
    """Upstream's report: each truncated question, and the state's tokens."""
    usage = agent.system_one(state, questions)["usage"]
    return {
        "questions": usage["truncated_questions"],
        "total": usage["state_tokens"],
        "dropped": usage["state_tokens_dropped"],
    }


def assert_agrees(entries: list[dict[str, Any]], upstream: dict[str, Any]) -> None:
    assert [entry["question"] for entry in entries] == upstream["questions"]
    assert {entry["total"] for entry in entries} == {upstream["total"]}
    assert max(entry["total"] - entry["read"] for entry in entries) == upstream["dropped"]


# -- cut -----------------------------------------------------------------------------------


def test_nothing_cut_no_header(cut: RunningServer) -> None:
    response = post(cut, "/v1/systemone", request(SHORT))
    assert response.status_code == 200, response.text
    assert HEADER not in response.headers
    batch = post(cut, "/v1/systemone/batch", {"requests": [request(SHORT)] * 2})
    assert batch.status_code == 200 and HEADER not in batch.headers


def test_every_cut_is_in_the_header_as_upstream_reports_it(cut: RunningServer, agent: Any) -> None:
    state = long_state(150, "header")
    counted = cut.metric("decidealot_truncated_states_total", provider="laya", checkpoint="english")
    response = post(cut, "/v1/systemone", request(state))
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"model", "answers", "usage"}  # the body is the contract's
    entries = parse_truncated(response.headers[HEADER])
    assert all(set(entry) == {"question", "read", "total"} for entry in entries)
    assert_agrees(entries, expected_cuts(agent, state, QUESTIONS))
    assert len(entries) == len(QUESTIONS)
    after = cut.metric("decidealot_truncated_states_total", provider="laya", checkpoint="english")
    assert after == counted + 1
    line = [json.loads(line) for line in cut.log_lines() if "state cut" in line][-1]
    assert line["level"] == "info" and "laya-english" in line["message"]
    for entry in entries:
        assert f"'{entry['question']}' read {entry['read']} of {entry['total']}" in line["message"]
    assert not any(SECRET in line for line in cut.log_lines())


def test_a_batch_header_names_each_item(cut: RunningServer, agent: Any) -> None:
    cut_list = [long_state(60, "first"), long_state(60, "newest")]  # a conversation: tail kept
    requests = [request(SHORT), request(long_state(90, "one")), request(cut_list)]
    response = post(cut, "/v1/systemone/batch", {"requests": requests})
    assert response.status_code == 200, response.text
    entries = parse_truncated(response.headers[HEADER])
    assert {entry["item"] for entry in entries} == {1, 2}
    for item in (1, 2):
        mine = [entry for entry in entries if entry["item"] == item]
        assert_agrees(mine, expected_cuts(agent, requests[item]["state"], QUESTIONS))


async def test_mcp_results_carry_the_cuts_in_meta(cut: RunningServer, agent: Any) -> None:
    state = long_state(120, "mcp")
    upstream = expected_cuts(agent, state, QUESTIONS)
    async with over_http(cut.url) as client:
        result = await client.call_tool("system_one", request(state))
        short = await client.call_tool("system_one", request(SHORT))
        batch = await client.call_tool(
            "system_one_batch", {"requests": [request(SHORT), request(state)]}
        )
    assert tool_outcome(result)[0] is False
    entries = result.meta[META]
    assert all(set(entry) == {"question", "read", "total"} for entry in entries)
    assert_agrees(entries, upstream)
    assert short.meta is None or META not in short.meta
    in_batch = batch.meta[META]
    assert {entry["item"] for entry in in_batch} == {1}
    assert_agrees(in_batch, upstream)


def von_cut(server: RunningServer, theirs: Any) -> httpx.Response:
    """`server`'s answer to `VON_STATE`, checked against von-sdk's evaluation `theirs`: its
    answers (1e-4), its tokens, and its cut in the header as von-sdk reports it."""
    body = {"model": "von", "state": VON_STATE, "questions": VON_QUESTIONS}
    response = post(server, "/v1/systemone", body)
    assert response.status_code == 200, response.text
    answered = response.json()
    answers = msgspec.convert(answered["answers"], dict[str, Answer])
    assert_same(answers, answers, theirs)
    assert answered["usage"]["input_tokens"] == theirs.usage.input_tokens
    entries = parse_truncated(response.headers[HEADER])
    assert [entry["question"] for entry in entries] == list(VON_QUESTIONS)
    assert len(entries) == theirs.truncation["questions_affected"]
    worst = max(entries, key=lambda entry: entry["total"])
    assert worst["total"] == theirs.truncation["state_tokens"]
    assert worst["read"] == theirs.truncation["kept_tokens"]
    return response


def test_von_reports_its_middle_cut_as_von_sdk_does(cut: RunningServer, von_sdk: Any) -> None:
    von_cut(cut, von_sdk)
    counted = cut.metric("decidealot_truncated_states_total", provider="von", checkpoint="von-1.1")
    assert counted == 1
    assert not any(SECRET in line for line in cut.log_lines())


async def test_forwarding_mcp_reads_the_header_into_meta(cut: RunningServer, agent: Any) -> None:
    """`decidealot mcp --url` gives what the server's header says."""
    state = long_state(100, "forwarded")
    upstream = expected_cuts(agent, state, QUESTIONS)
    async with over_stdio(["--url", cut.url], {}) as client:
        result = await client.call_tool("system_one", request(state))
        batch = await client.call_tool(
            "system_one_batch", {"requests": [request(state), request(SHORT)]}
        )
        short = await client.call_tool("system_one", request(SHORT))
    assert_agrees(result.meta[META], upstream)
    assert {entry["item"] for entry in batch.meta[META]} == {0}
    assert short.meta is None or META not in short.meta


# -- refuse --------------------------------------------------------------------------------


def test_refuse_answers_422_at_the_state_before_any_pass(refuse: RunningServer, agent: Any) -> None:
    assert post(refuse, "/v1/systemone", request(SHORT)).status_code == 200  # loaded
    passes = refuse.metric("decidealot_forward_pass_seconds_count")
    state = long_state(150, "refused")
    usage = agent.system_one(state, QUESTIONS)["usage"]
    response = post(refuse, "/v1/systemone", request(state))
    assert response.status_code == 422, response.text
    (issue,) = response.json()["detail"]
    assert issue["loc"] == ["body", "state"]
    assert f"{usage['state_tokens']} tokens" in issue["msg"]
    assert f"room for {usage['state_tokens'] - usage['state_tokens_dropped']}" in issue["msg"]
    assert SECRET not in response.text
    batch = post(refuse, "/v1/systemone/batch", {"requests": [request(SHORT), request(state)]})
    assert batch.status_code == 422
    assert [i["loc"] for i in batch.json()["detail"]] == [["body", "requests", 1, "state"]]
    assert refuse.metric("decidealot_forward_pass_seconds_count") - passes <= 1  # item 0's
    short = post(refuse, "/v1/systemone", request(SHORT))
    assert short.status_code == 200 and HEADER not in short.headers


def test_von_refuses_what_it_would_cut(refuse: RunningServer) -> None:
    questions = {"late": {"type": "noul", "instructions": "Was the payment sent twice?"}}
    short = {"model": "von", "state": SHORT, "questions": questions}
    assert post(refuse, "/v1/systemone", short).status_code == 200
    passes = refuse.metric("decidealot_forward_pass_seconds_count", provider="von")
    state = f"{SECRET} " + "The refund for order 84213 was sent twice. " * 1200
    response = post(refuse, "/v1/systemone", {**short, "state": state})
    assert response.status_code == 422, response.text
    (issue,) = response.json()["detail"]
    assert issue["loc"] == ["body", "state"]
    assert re.search(
        r"the state has \d+ tokens and question 'late' leaves room for \d+", issue["msg"]
    )
    assert "von-1.1's 8192-token window" in issue["msg"] and SECRET not in response.text
    assert refuse.metric("decidealot_forward_pass_seconds_count", provider="von") == passes


async def test_refuse_is_a_tool_error_over_mcp(refuse: RunningServer) -> None:
    state = long_state(150, "mcp-refused")
    http = post(refuse, "/v1/systemone", request(state)).json()
    async with over_http(refuse.url) as client:
        result = await client.call_tool("system_one", request(state))
        batch = await client.call_tool("system_one_batch", {"requests": [request(state)]})
    assert tool_outcome(result) == (True, http)
    is_error, envelope = tool_outcome(batch)
    assert is_error and envelope["detail"][0]["loc"] == ["body", "requests", 0, "state"]


# -- windows -------------------------------------------------------------------------------


def test_windows_answer_as_predict_long(windows: RunningServer, agent: Any) -> None:
    for state in (SHORT, long_state(25, "two"), {"body": long_state(40, "object")}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            theirs = agent.predict_long(state, QUESTIONS)
        response = post(windows, "/v1/systemone", request(state))
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["usage"]["input_tokens"] == theirs["usage"]["input_tokens"]
        for name, expected in theirs["answers"].items():
            got = body["answers"][name]
            if expected["type"] == "noul":
                assert got["noul"] == pytest.approx(expected["noul"], abs=1e-4)
                continue
            for label, p in expected["probabilities"].items():
                assert got["probabilities"][label] == pytest.approx(p, abs=1e-4)
            assert got["confidence"] == pytest.approx(expected["confidence"], abs=1e-4)
        if not theirs["usage"].get("truncated"):
            assert HEADER not in response.headers  # the whole state was read
    assert theirs["usage"]["windows"] > 1


def test_windows_count_against_the_request_token_bound(windows: RunningServer) -> None:
    state = long_state(80, "bounded")  # 7 windows of 3 rows: about 2500 tokens
    response = post(windows, "/v1/systemone", request(state))
    assert response.status_code == 422, response.text
    (issue,) = response.json()["detail"]
    assert "DECIDEALOT_MAX_REQUEST_TOKENS" in issue["msg"]
    found = re.search(r"costs (\d+) model tokens", issue["msg"])
    assert found is not None and int(found.group(1)) > WINDOWS_BOUND


def test_von_under_windows_keeps_its_cut(
    von_windows: RunningServer, cut: RunningServer, von_sdk: Any
) -> None:
    """Von has no windows: under `windows` it answers, counts and reports exactly as under
    `cut`, and as von-sdk cuts."""
    windowed, cut_answer = von_cut(von_windows, von_sdk), von_cut(cut, von_sdk)
    assert windowed.json() == cut_answer.json()  # the same probabilities, to the last bit
    assert windowed.headers[HEADER] == cut_answer.headers[HEADER]
    truncated = von_windows.metric(
        "decidealot_truncated_states_total", provider="von", checkpoint="von-1.1"
    )
    assert truncated == 1
    line = [json.loads(line) for line in von_windows.log_lines() if "state cut" in line][-1]
    assert "von-1.1" in line["message"] and SECRET not in line["message"]


async def test_von_under_windows_reports_its_cut_over_mcp(von_windows: RunningServer) -> None:
    """What the header says under `windows`, an MCP tool result says in its `_meta`."""
    body = {"model": "von", "state": VON_STATE, "questions": VON_QUESTIONS}
    header = parse_truncated(post(von_windows, "/v1/systemone", body).headers[HEADER])
    async with over_http(von_windows.url) as client:
        result = await client.call_tool("system_one", body)
    assert tool_outcome(result)[0] is False
    assert result.meta[META] == header
