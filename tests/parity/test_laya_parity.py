"""Laya engine parity with the installed upstream package (`laya.Agent.system_one`).

Tiny random checkpoints of all three variants; seeded random requests cover dict/list/string
states, `[MASK]` injection, structured instructions and criteria, missing instructions, long
states that truncate (front and tail), 1-40 options (including option-span collapse and the
marker overflow error), and noul with and without criteria.

On CUDA (skipped without a GPU) both sides run there under the autocast dtype upstream picks
(the checkpoint's bf16 on compute capability >= 8, else fp16), so probabilities are compared to
what that dtype's rounding allows (tests/support/devices.py) rather than fp32's 1e-4, and a
choice may differ from upstream's only between options that dtype cannot tell apart.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from decidealot.contract import SystemOneRequest
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.planner import run_together
from decidealot.providers.laya.tiny import VARIANTS
from decidealot.providers.laya.worker.engine import LayaEngine, create
from tests.support.checkpoints import TinyCheckpoints
from tests.support.devices import DEVICES, autocast_tolerance

laya = pytest.importorskip("laya")
upstream_agent = pytest.importorskip("laya.agent")

TOLERANCE = 1e-4
SCORE_LEVELS = (1, 2, 3, 4, 7, 11)
WORDS = [
    "refund",
    "payment",
    "duplicate",
    "the",
    "customer",
    "is",
    "and",
    "account",
    "delete",
    "Konto",
    "wurde",
    "zweimal",
    "belastet",
    "commande",
    "annuler",
    "заказ",
    "пришёл",
    "订单",
    "注文",
    "주문",
    "طلبي",
    "ऑर्डर",
    "urgent",
    "review",
    "protected-record",
    "42",
    "3.5",
]


@pytest.fixture(scope="session")
def checkpoints(tiny: TinyCheckpoints) -> dict[str, Path]:
    return tiny.laya_all(seeds={v: i for i, v in enumerate(VARIANTS)})


@dataclass(frozen=True)
class Side:
    """Our engine and upstream's agents on one device, and how close they must agree there."""

    engine: LayaEngine
    agents: dict[str, Any]
    tolerance: float
    score_tolerance: float
    """A score is the sum of i * p_i: its error grows with the level count under autocast."""


@pytest.fixture(scope="session", params=DEVICES)
def side(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> Iterator[Side]:
    device: str = request.param
    spec = EngineSpec(
        factory="decidealot.providers.laya.worker.engine:create",
        checkpoints={k: str(p) for k, p in checkpoints.items()},
        preload=["english"],
        options={"precision": "fp32"},  # parity is fp32's; auto, the default, may run bf16
        device=device,
    )
    engine = create(spec)
    saved_amp = os.environ.pop("LAYA_CUDA_AMP", None)  # upstream's override; ours has none
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the shipped choice:11+ clamp warning
            agents = {k: laya.load(str(p), device=device) for k, p in checkpoints.items()}
    finally:
        if saved_amp is not None:
            os.environ["LAYA_CUDA_AMP"] = saved_amp
    if device == "cpu":
        yield Side(engine, agents, TOLERANCE, TOLERANCE)
        return
    dtypes = set()
    for key, agent in agents.items():
        assert agent.device.type == "cuda" and agent.amp_enabled  # no silent CPU fallback
        assert engine._checkpoint(key).amp_dtype == agent.dtype  # the same autocast dtype
        dtypes.add(agent.dtype)
    tolerance = max(autocast_tolerance(dtype) for dtype in dtypes)
    yield Side(engine, agents, tolerance, tolerance * (max(SCORE_LEVELS) - 1))


@pytest.fixture(autouse=True)
def unrounded_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream rounds answers to 4 decimals with the builtin `round`; compare full precision."""
    monkeypatch.setattr(upstream_agent, "round", lambda value, digits=None: value, raising=False)


# -- random requests -------------------------------------------------------------------------


def _text(rng: random.Random, low: int = 1, high: int = 8, mask: str = "") -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    if mask and rng.random() < 0.2:
        words.insert(rng.randrange(len(words) + 1), mask)
    return " ".join(words)


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value: mostly strings, sometimes numbers, booleans, objects or arrays."""
    roll = rng.random()
    if depth < 2 and roll < 0.15:
        return {_text(rng, 1, 2): _value(rng, depth + 1) for _ in range(rng.randint(1, 3))}
    if depth < 2 and roll < 0.3:
        return [_value(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if roll < 0.38:
        return rng.choice([7, 2.5, True, -1])
    return _text(rng, mask="[MASK]")


def _state(rng: random.Random) -> Any:
    long = rng.random() < 0.25
    size = (60, 120) if long else (1, 12)
    kind = rng.choice(["str", "dict", "list"])
    if kind == "str":
        return _text(rng, *size, mask=rng.choice(["[MASK]", "<mask>"]))
    if kind == "dict":
        return {f"field{i}": _value(rng) if not long else _text(rng, *size) for i in range(3)}
    return [_text(rng, *size) if long else _value(rng) for _ in range(rng.randint(1, 4))]


def _instructions(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.3:
        return {"task": _text(rng), "rules": [_text(rng), {"nested": _text(rng)}]}
    if roll < 0.4:
        return [_text(rng), _text(rng)]
    return _text(rng, 2, 12, mask="[MASK]")


def _question(rng: random.Random) -> dict[str, Any]:
    qtype = rng.choice(["choice", "score", "noul"])
    question: dict[str, Any] = {"type": qtype, "instructions": _instructions(rng)}
    if qtype == "choice":
        count = rng.choice([1, 2, 3, 5, 8, 12, 20, 40])
        question["criteria"] = {
            f"opt{i}_{rng.choice(WORDS)}": rng.choice([None, "", _value(rng)]) for i in range(count)
        }
    elif qtype == "score":
        question["criteria"] = [_value(rng) for _ in range(rng.choice(SCORE_LEVELS))]
    else:
        roll = rng.random()
        if roll < 0.3:
            question["criteria"] = None
        elif roll < 0.6:
            question["criteria"] = {"true": rng.choice([None, "", _value(rng)])}
        else:
            question["criteria"] = {"false": rng.choice([None, _value(rng)]), "true": _value(rng)}
    return question


def _request(rng: random.Random) -> SystemOneRequest:
    questions = {f"q{i}": _question(rng) for i in range(rng.randint(1, 4))}
    return msgspec.convert(
        {"model": "laya", "state": _state(rng), "questions": questions}, SystemOneRequest
    )


def _upstream_questions(request: SystemOneRequest) -> dict[str, dict[str, Any]]:
    """The same questions as upstream takes them; missing instructions become the name."""
    out: dict[str, dict[str, Any]] = {}
    for name, question in request.questions.items():
        raw = msgspec.to_builtins(question)
        if raw.get("instructions") is None:
            raw["instructions"] = name
        out[name] = raw
    return out


def _decide(engine: LayaEngine, checkpoint: str, request: SystemOneRequest) -> Decision:
    job = Job(checkpoint=checkpoint, state=request.state, questions=request.questions)
    return run_together(engine, [engine.prepare(job)])[0]


def _assert_parity(
    ours: Decision,
    theirs: dict[str, Any],
    tolerance: float = TOLERANCE,
    score_tolerance: float = TOLERANCE,
) -> None:
    """`ours` (an engine's, or a served answer's) against `system_one`'s answer `theirs`."""
    assert ours.input_tokens == theirs["usage"]["input_tokens"]
    assert set(ours.answers) == set(theirs["answers"])
    for name, answer in ours.answers.items():
        expected = theirs["answers"][name]
        got = msgspec.to_builtins(answer)
        assert got["type"] == expected["type"]
        if expected["type"] == "noul":
            assert got["noul"] == pytest.approx(expected["noul"], abs=tolerance)
            continue
        assert got["probabilities"].keys() == expected["probabilities"].keys()
        for label, p in expected["probabilities"].items():
            assert got["probabilities"][label] == pytest.approx(p, abs=tolerance)
        assert got["confidence"] == pytest.approx(expected["confidence"], abs=tolerance)
        if expected["type"] == "choice":
            assert got["choice"] == expected["choice"] or (
                # under autocast only: a near tie may go either way
                tolerance > TOLERANCE
                and expected["probabilities"][got["choice"]]
                >= expected["probabilities"][expected["choice"]] - 2 * tolerance
            ), (name, got["choice"], expected["choice"])
        else:
            assert got["score"] == pytest.approx(expected["score"], abs=score_tolerance)


@pytest.mark.parametrize("variant", VARIANTS)
def test_random_requests_match_upstream(variant: str, side: Side) -> None:
    rng = random.Random(f"laya-parity-{variant}")
    compared = refused = 0
    for _ in range(60):
        request = _request(rng)
        try:
            theirs = side.agents[variant].system_one(request.state, _upstream_questions(request))
        except ValueError as exc:
            assert "option markers fit" in str(exc)
            with pytest.raises(RequestInvalid) as caught:
                _decide(side.engine, variant, request)
            assert caught.value.issues[0].loc[1] in request.questions
            refused += 1
            continue
        _assert_parity(
            _decide(side.engine, variant, request), theirs, side.tolerance, side.score_tolerance
        )
        compared += 1
    assert compared >= 40 and refused >= 1  # both paths were exercised


def test_truncation_and_collapse_match_upstream(side: Side) -> None:
    """State cut at the front (dict) and the tail (list); 20 options collapse to 4 tokens each."""
    questions = {
        "pick": {
            "type": "choice",
            "instructions": "Pick the queue.",
            "criteria": {f"queue{i}": "a shared long description of the queue" for i in range(20)},
        },
        "flag": {"type": "noul", "instructions": "Is it urgent?"},
    }
    long_words = " ".join(WORDS * 20)
    for state in ({"body": long_words}, [long_words, "the newest turn"], long_words):
        request = msgspec.convert(
            {"model": "laya", "state": state, "questions": questions}, SystemOneRequest
        )
        theirs = side.agents["english"].system_one(state, questions)
        assert theirs["usage"]["truncated"]
        assert "options" in theirs["usage"]  # the capped spans collided
        _assert_parity(
            _decide(side.engine, "english", request), theirs, side.tolerance, side.score_tolerance
        )


def test_marker_overflow_is_a_decision_input_error(side: Side) -> None:
    engine = side.engine
    criteria = {f"label{i}": f"description number {i}" for i in range(40)}
    request = msgspec.convert(
        {
            "model": "laya-english",
            "state": "private-state-text",
            "questions": {
                "fine": {"type": "noul", "instructions": "ok?"},
                "crowded": {"type": "choice", "instructions": "Pick", "criteria": criteria},
            },
        },
        SystemOneRequest,
    )
    with pytest.raises(RequestInvalid) as caught:
        engine.prepare(Job(checkpoint="english", state=request.state, questions=request.questions))
    (issue,) = caught.value.issues
    assert issue.loc == ["questions", "crowded", "criteria"]
    assert "private-state-text" not in issue.msg  # never echoes the state
