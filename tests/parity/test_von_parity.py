"""Parity of our Von engine with the installed von-sdk 1.3.7 backend on tiny random checkpoints.

Both answer the same seeded requests (all three question types, structured instructions and
criteria, digit runs, injected special-token literals, states long enough to be cut) in both
attention modes, with and without a calibration map and a noul prior. Upstream runs with its
chains off and the raw noul decision, as Decidealot serves Von. On CUDA (skipped without a GPU)
both sides run there, still in fp32 as upstream runs Von everywhere, to the same tolerance.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from decidealot.contract import Question
from decidealot.jobs import EngineSpec, Job
from decidealot.providers.engine.planner import run_together
from decidealot.providers.von.worker.engine import VonEngine, create
from tests.support.checkpoints import TinyCheckpoints
from tests.support.devices import DEVICES, assert_fp32_matmul_is_ieee
from tests.support.von_answers import assert_same

MAX_STATE_TOKENS = 64  # low, so long generated states are cut in the middle
REQUESTS_PER_VARIANT = 30

VARIANTS: dict[str, dict[str, Any]] = {
    "independent": {"independent_options": True, "digit_split": True},
    "plain": {"independent_options": False, "digit_split": False, "seed": 1},
    "independent-scalar": {
        "independent_options": True,
        "digit_split": False,
        "seed": 2,
        "calibration_map": None,
        "noul_prior": None,
        "temperature": 2.2,
    },
    "plain-scalar": {
        "independent_options": False,
        "digit_split": True,
        "seed": 3,
        "calibration_map": None,
        "noul_prior": None,
        "temperature": 2.2,
    },
}

_UPSTREAM_ENV = {
    "VON_CHAINS_DIR": "off",
    "VON_NOUL_DECISION": "raw",
    "VON_MAX_STATE_TOKENS": str(MAX_STATE_TOKENS),
    "HF_HUB_OFFLINE": "1",
}

_WORDS = (
    "refund",
    "payment",
    "invoice",
    "customer",
    "account",
    "order",
    "shipped",
    "late",
    "protected",
    "record",
    "delete",
    "review",
    "urgent",
    "routine",
    "billing",
    "technical",
    "support",
    "access",
    "approval",
    "queue",
    "audit",
    "request",
)


@pytest.fixture(scope="session")
def checkpoints(tiny: TinyCheckpoints) -> dict[str, Path]:
    return {name: tiny.von(**kw) for name, kw in VARIANTS.items()}


@pytest.fixture(scope="session", params=DEVICES)
def pairs(
    request: pytest.FixtureRequest,
    checkpoints: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Any, VonEngine]]]:
    """Per variant: the upstream backend (loaded under parity env) and our engine, both on the
    parametrised device."""
    from von.backends.option_marker_backend import OptionMarkerBackend

    device: str = request.param
    if device == "cuda":
        assert_fp32_matmul_is_ieee()
    env = {
        **_UPSTREAM_ENV,
        "VON_DEVICE": device,
        "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg")),
    }
    saved = {key: os.environ.get(key) for key in [*env, "VON_CALIBRATION"]}
    os.environ.update(env)
    os.environ.pop("VON_CALIBRATION", None)
    try:
        result = {}
        for name, path in checkpoints.items():
            upstream = OptionMarkerBackend(checkpoint_dir=str(path), device=device)
            upstream._get_model()  # loads lazily, and reads the environment when it does
            assert upstream.device.type == device  # no silent fallback to the CPU
            ours = create(
                EngineSpec(
                    factory="decidealot.providers.von.worker.engine:create",
                    checkpoints={"von-1.1": str(path)},
                    # parity is fp32's; auto, the default, may run bf16
                    options={"max_state_tokens": MAX_STATE_TOKENS, "precision": "fp32"},
                    device=device,
                )
            )
            result[name] = (upstream, ours)
        yield result
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- request generation ------------------------------------------------------------------------


def _sentence(rng: random.Random, low: int = 3, high: int = 9) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(low, high))]
    if rng.random() < 0.4:
        words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 99999)))
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words) + 1), rng.choice(["[MASK]", "[SEP]", "[CLS]"]))
    return " ".join(words).capitalize() + "."


def _state(rng: random.Random) -> Any:
    long = rng.random() < 0.3
    n = rng.randint(12, 20) if long else rng.randint(1, 3)
    kind = rng.choice(["str", "dict", "list"])
    if kind == "str":
        return " ".join(_sentence(rng) for _ in range(n))
    if kind == "dict":
        state: dict[str, Any] = {f"field_{i}": _sentence(rng) for i in range(n)}
        state["flags"] = {"reversible": rng.random() < 0.5, "count": rng.randint(0, 500)}
        state["missing"] = None
        return state
    return [_sentence(rng) for _ in range(n)]


def _instructions(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return _sentence(rng)
    if roll < 0.8:
        return {"task": _sentence(rng), "rules": [_sentence(rng, 2, 4)], "id": rng.randint(1, 9)}
    return [_sentence(rng, 2, 4), {"b": 1, "a": _sentence(rng, 1, 3)}]


def _criterion(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return _sentence(rng, 2, 6)
    if roll < 0.7:
        return None
    if roll < 0.8:
        return {"label": _sentence(rng, 1, 3), "weight": rng.randint(1, 5)}
    if roll < 0.9:
        return [_sentence(rng, 1, 2), rng.randint(0, 9)]
    return rng.randint(0, 1000)


def _question(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["choice", "score", "noul"])
    question: dict[str, Any] = {"type": kind, "instructions": _instructions(rng)}
    if kind == "choice":
        labels = rng.sample(_WORDS, rng.randint(2, 5))
        question["criteria"] = {label: _criterion(rng) for label in labels}
    elif kind == "score":
        levels: list[Any] = []
        for _ in range(rng.randint(2, 5)):
            if rng.random() < 0.3:
                examples = [_sentence(rng, 1, 2) for _ in range(rng.randint(0, 2))]
                levels.append({"what": _sentence(rng, 2, 4), "examples": examples})
            else:
                levels.append(_sentence(rng, 1, 5))
        question["criteria"] = levels
    else:
        shape = rng.choice(["none", "empty", "true", "false", "both"])
        if shape == "empty":
            question["criteria"] = {}
        elif shape != "none":
            criteria = {key: _sentence(rng, 2, 5) for key in ("true", "false")}
            question["criteria"] = criteria if shape == "both" else {shape: criteria[shape]}
    return question


def _request(rng: random.Random) -> tuple[Any, dict[str, dict[str, Any]]]:
    questions = {f"q{i}": _question(rng) for i in range(rng.randint(1, 4))}
    return _state(rng), questions


# -- comparison --------------------------------------------------------------------------------
#
# Upstream rounds what it reports (probabilities and noul to 4 places, confidence to 3, score to
# 2); Decidealot reports unrounded values. Each of ours must lie within TOLERANCE of some value
# that rounds to what upstream reported.


def _ours(
    engine: VonEngine, state: Any, questions: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Our answers (twice, for the callers that compare reported and raw values) and tokens."""
    job = Job(
        checkpoint="von-1.1",
        state=state,
        questions=msgspec.convert(questions, dict[str, Question]),
    )
    (decision,) = run_together(engine, [engine.prepare(job)])
    assert decision.model == "von-1.1"
    return decision.answers, decision.answers, decision.input_tokens


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_generated_requests_match_upstream(
    pairs: dict[str, tuple[Any, VonEngine]], variant: str
) -> None:
    upstream, ours = pairs[variant]
    rng = random.Random(f"von-parity-{variant}")
    truncated = 0
    for _ in range(REQUESTS_PER_VARIANT):
        state, questions = _request(rng)
        theirs = upstream.evaluate(state, questions)
        answers, unrounded, input_tokens = _ours(ours, state, questions)
        assert_same(answers, unrounded, theirs)
        assert input_tokens == theirs.usage.input_tokens
        truncated += theirs.truncation is not None
    assert truncated > 0  # the middle cut was exercised


@pytest.mark.parametrize("variant", ["independent", "independent-scalar"])
def test_option_order_does_not_matter_in_independent_mode(
    pairs: dict[str, tuple[Any, VonEngine]], variant: str
) -> None:
    upstream, ours = pairs[variant]
    rng = random.Random(f"von-order-{variant}")
    for _ in range(8):
        state = _state(rng)
        criteria = {label: _sentence(rng, 2, 6) for label in rng.sample(_WORDS, 4)}
        labels = list(criteria)
        rng.shuffle(labels)
        shuffled = {label: criteria[label] for label in labels}
        base = {"type": "choice", "instructions": _sentence(rng), "criteria": criteria}
        questions = {"a": base, "b": {**base, "criteria": shuffled}}
        answers, unrounded, _ = _ours(ours, state, questions)
        assert_same(answers, unrounded, upstream.evaluate(state, questions))
        for label in criteria:
            assert unrounded["a"].probabilities[label] == pytest.approx(
                unrounded["b"].probabilities[label], abs=1e-5
            )
        assert answers["a"].choice == answers["b"].choice


def test_plain_mode_depends_on_option_order(pairs: dict[str, tuple[Any, VonEngine]]) -> None:
    _, ours = pairs["plain"]
    criteria = {"billing": "Payment question", "technical": "Software failure", "sales": "Quote"}
    reversed_criteria = dict(reversed(criteria.items()))
    questions = {
        "a": {"type": "choice", "instructions": "Route it.", "criteria": criteria},
        "b": {"type": "choice", "instructions": "Route it.", "criteria": reversed_criteria},
    }
    _, unrounded, _ = _ours(ours, "The refund failed twice.", questions)
    moved = max(
        abs(unrounded["a"].probabilities[label] - unrounded["b"].probabilities[label])
        for label in criteria
    )
    assert moved > 1e-4


@pytest.mark.parametrize("variant", ["independent", "plain"])
def test_missing_instructions_are_asked_as_empty(
    pairs: dict[str, tuple[Any, VonEngine]], variant: str
) -> None:
    """Upstream requires instructions; ours treats an absent one as upstream treats ""."""
    upstream, ours = pairs[variant]
    questions = {
        "route": {"type": "choice", "criteria": {"standard": "Normal queue", "review": None}},
        "urgency": {"type": "score", "criteria": ["routine", "important", "urgent"]},
        "can_run": {"type": "noul"},
        "may_run": {"type": "noul", "criteria": {"true": "The request may run now."}},
    }
    state = {"summary": "Access change for an account with 12 protected records.", "ok": False}
    answers, unrounded, input_tokens = _ours(ours, state, questions)
    with_empty = {name: {**q, "instructions": ""} for name, q in questions.items()}
    theirs = upstream.evaluate(state, with_empty)
    assert_same(answers, unrounded, theirs)
    assert input_tokens == theirs.usage.input_tokens


def test_empty_criteria_answer_without_a_pass(pairs: dict[str, tuple[Any, VonEngine]]) -> None:
    upstream, ours = pairs["independent"]
    questions = {
        "none": {"type": "choice", "instructions": "Pick one.", "criteria": {}},
        "levels": {"type": "score", "instructions": "Rate it.", "criteria": []},
    }
    state = "A short state."
    answers, unrounded, input_tokens = _ours(ours, state, questions)
    theirs = upstream.evaluate(state, questions)
    assert_same(answers, unrounded, theirs)
    assert input_tokens == theirs.usage.input_tokens
