"""Laya's long states against the installed laya 0.4.15, in each `DECIDEALOT_LONG_STATES` mode.

`cut`: what the engine reports cut (`Decision.cuts`) is what upstream's `system_one` reports in
its usage: the same `truncated_questions` in order, every question's `total` its
`state_tokens`, and the most any question dropped its `state_tokens_dropped` (upstream reports
the worst question's drop: its questions share one state, not one head budget).
`windows`: the answers and `usage.input_tokens` of `Agent.predict_long` with its defaults, on
states of several lengths (one that fits the room the questions leave, read as `system_one`
reads it), shapes (string, object, list) and scripts, on the english and multilingual tiny
checkpoints. `refuse`: a state that would be cut is refused before any pass, at `state`.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from decidealot.contract import Question
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.planner import Planner, run_together
from decidealot.providers.laya.tiny import VARIANTS
from decidealot.providers.laya.worker.engine import LayaEngine, create
from tests.support.checkpoints import TinyCheckpoints
from tests.support.questions import TICKET_QUESTIONS as QUESTIONS

laya = pytest.importorskip("laya")

TOLERANCE = 1e-4
"""Upstream rounds what it returns to 4 decimals; ours is not rounded."""
CHECKPOINTS = ("english", "multilingual")
WORDS = {
    "latin": ("refund", "payment", "the", "customer", "is", "and", "account", "urgent", "42"),
    "cjk": ("订单", "还没有", "到", "退还", "重复", "付款", "注文", "주문"),
    "arabic": ("طلبي", "رقم", "لم", "يصل", "بعد", "أريد", "استرداد", "ऑर्डर"),
}
CROWDED = {
    "type": "choice",
    "instructions": "Pick the team.",
    "criteria": {f"team{i}": f"the team for case kind {i}" for i in range(9)},
}
"""Its options leave the least room for the state: the windows are sized to it."""


@dataclass(frozen=True)
class Sides:
    paths: dict[str, Path]
    agents: dict[str, Any]
    engines: dict[str, LayaEngine]
    """By mode."""


@pytest.fixture(scope="module")
def sides(tiny: TinyCheckpoints) -> Iterator[Sides]:
    paths: dict[str, Path] = tiny.laya_all(seeds={v: i for i, v in enumerate(VARIANTS)})
    engines = {
        mode: create(
            EngineSpec(
                factory="decidealot.providers.laya.worker.engine:create",
                checkpoints={k: str(paths[k]) for k in CHECKPOINTS},
                device="cpu",
                options={"long_states": mode},
            )
        )
        for mode in ("cut", "refuse", "windows")
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the shipped choice:11+ clamp warning
        agents = {k: laya.load(str(paths[k]), device="cpu") for k in CHECKPOINTS}
    yield Sides(paths, agents, engines)


def _state(rng: random.Random, shape: str, script: str, words: int) -> Any:
    """A state of `shape` with about `words` words of `script`."""

    def text(count: int) -> str:
        return " ".join(rng.choice(WORDS[script]) for _ in range(max(1, count)))

    if shape == "string":
        return text(words)
    if shape == "object":
        return {"subject": text(3), "body": text(words - 3)}
    return [text(words // 3), text(words // 3), text(words - 2 * (words // 3))]


def _decide(engine: LayaEngine, checkpoint: str, state: Any, questions: dict) -> Decision:
    job = Job(checkpoint, state, msgspec.convert(questions, dict[str, Question]))
    return run_together(engine, [engine.prepare(job)])[0]


def _assert_answers(ours: Decision, theirs: dict[str, Any]) -> None:
    assert ours.input_tokens == theirs["usage"]["input_tokens"]
    assert set(ours.answers) == set(theirs["answers"])
    for name, answer in ours.answers.items():
        expected, got = theirs["answers"][name], msgspec.to_builtins(answer)
        if expected["type"] == "noul":
            assert got["noul"] == pytest.approx(expected["noul"], abs=TOLERANCE), name
            continue
        for label, p in expected["probabilities"].items():
            assert got["probabilities"][label] == pytest.approx(p, abs=TOLERANCE), name
        assert got["confidence"] == pytest.approx(expected["confidence"], abs=TOLERANCE), name
        if expected["type"] == "choice":
            assert got["choice"] == expected["choice"], name
        else:
            assert got["score"] == pytest.approx(expected["score"], abs=2 * TOLERANCE), name


CASES = [
    (checkpoint, shape, script, words)
    for checkpoint, script in (("english", "latin"), ("multilingual", "cjk"), ("english", "arabic"))
    for shape in ("string", "object", "list")
    for words in (6, 45, 160)
]


@pytest.mark.parametrize(("checkpoint", "shape", "script", "words"), CASES)
def test_cut_reports_what_system_one_reports(
    sides: Sides, checkpoint: str, shape: str, script: str, words: int
) -> None:
    rng = random.Random(f"cut-{checkpoint}-{shape}-{script}-{words}")
    state = _state(rng, shape, script, words)
    questions = {**QUESTIONS, "crowded": CROWDED}
    theirs = sides.agents[checkpoint].system_one(state, questions)
    ours = _decide(sides.engines["cut"], checkpoint, state, questions)
    _assert_answers(ours, theirs)
    usage = theirs["usage"]
    assert [cut.question for cut in ours.cuts] == usage["truncated_questions"]
    assert bool(ours.cuts) == usage["truncated"]
    if ours.cuts:
        assert {cut.total for cut in ours.cuts} == {usage["state_tokens"]}
        assert max(cut.total - cut.read for cut in ours.cuts) == usage["state_tokens_dropped"]
        assert all(0 <= cut.read < cut.total for cut in ours.cuts)
    if words == 160:
        assert ours.cuts  # the long states are cut for every question
        assert [cut.question for cut in ours.cuts] == list(questions)


@pytest.mark.parametrize(("checkpoint", "shape", "script", "words"), CASES)
def test_windows_answer_as_predict_long(
    sides: Sides, checkpoint: str, shape: str, script: str, words: int
) -> None:
    rng = random.Random(f"windows-{checkpoint}-{shape}-{script}-{words}")
    state = _state(rng, shape, script, words)
    questions = dict(QUESTIONS) if words != 45 else {**QUESTIONS, "crowded": CROWDED}
    agent = sides.agents[checkpoint]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the window clamp at many options
        theirs = agent.predict_long(state, questions)
    ours = _decide(sides.engines["windows"], checkpoint, state, questions)
    _assert_answers(ours, theirs)
    if theirs["usage"]["windows"] == 1:  # it fit the room: exactly system_one
        assert ours.cuts == []
        _assert_answers(ours, agent.system_one(state, questions))
    if words == 160:
        assert theirs["usage"]["windows"] > 2  # a scan of several windows
    if not theirs["usage"].get("truncated"):
        assert ours.cuts == []  # every window read whole: nothing to report


def test_a_state_that_fits_is_not_windowed(sides: Sides) -> None:
    """Below the room the questions leave, windows and cut read the same single row."""
    state = "The customer asked for a refund."
    ours = _decide(sides.engines["windows"], "english", state, QUESTIONS)
    plain = _decide(sides.engines["cut"], "english", state, QUESTIONS)
    assert ours.input_tokens == plain.input_tokens
    assert msgspec.to_builtins(ours.answers) == msgspec.to_builtins(plain.answers)


def test_refuse_names_the_tokens_and_the_room_before_any_pass(sides: Sides) -> None:
    engine = sides.engines["refuse"]
    rng = random.Random("refuse")
    short = _state(rng, "string", "latin", 6)
    assert _decide(engine, "english", short, QUESTIONS).cuts == []
    long = _state(rng, "object", "latin", 160)
    theirs = sides.agents["english"].system_one(long, QUESTIONS)["usage"]
    job = Job("english", long, msgspec.convert(QUESTIONS, dict[str, Question]))
    with pytest.raises(RequestInvalid) as caught:
        engine.prepare(job)  # prepare runs before any pass: nothing was planned
    (issue,) = caught.value.issues
    assert issue.loc == ["state"]
    assert issue.input is None  # never echoes the state
    assert f"{theirs['state_tokens']} tokens" in issue.msg
    assert "DECIDEALOT_LONG_STATES" in issue.msg
    room = theirs["state_tokens"] - theirs["state_tokens_dropped"]
    assert f"room for {room}" in issue.msg


def test_windows_are_rows_that_share_turns_with_other_jobs(sides: Sides) -> None:
    """A windowed job's rows go through the planner like any others: a short request's rows
    run in the same turn, and each job's answers are those it gets alone."""
    engine = sides.engines["windows"]
    questions = msgspec.convert(QUESTIONS, dict[str, Question])
    rng = random.Random("shared")
    long = engine.prepare(Job("english", _state(rng, "string", "latin", 160), questions))
    short = engine.prepare(Job("english", "The customer was charged twice.", questions))
    assert long.windows > 2 and len(long.rows) == long.windows * len(QUESTIONS)
    planner = Planner(4096, engine.shape)
    planner.add(0, long)
    planner.add(1, short)
    assert {job.id for each in planner.take() for job in each.jobs} == {0, 1}
    together = run_together(engine, [long, short], 4096)
    for prepared, decision in zip((long, short), together, strict=True):
        (alone,) = run_together(engine, [prepared])
        assert decision.input_tokens == alone.input_tokens
        for name, answer in msgspec.to_builtins(decision.answers).items():
            expected = msgspec.to_builtins(alone.answers)[name]
            for key in ("noul", "score", "confidence"):
                if key in expected:
                    assert answer[key] == pytest.approx(expected[key], abs=1e-5)


def test_windows_pick_through_a_calibration_files_binning_map(sides: Sides, tmp_path: Path) -> None:
    """A laya calibration file's binning map recalibrates `answer_confidence`, which is what
    picks a choice's or score's window: coarse bins make ties, and the first tied window wins."""
    path = str(sides.paths["english"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        writer, upstream = laya.load(path, device="cpu"), laya.load(path, device="cpu")
    writer.binning_map = {
        "choice:3-5": {"bins": 3, "values": [0.2, 0.5, 0.9]},
        "score:3-5": {"bins": 2, "values": [0.4, 0.8]},
    }
    calibration = tmp_path / "calibration.json"
    writer.save_calibration(str(calibration))
    upstream.load_calibration(str(calibration))
    engine = create(
        EngineSpec(
            factory="decidealot.providers.laya.worker.engine:create",
            checkpoints={"english": path},
            device="cpu",
            options={"long_states": "windows", "calibrations": {"english": str(calibration)}},
        )
    )
    moved = 0
    for words in (45, 160):
        for shape in ("string", "object"):
            state = _state(random.Random(f"binned-{words}-{shape}"), shape, "latin", words)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                theirs = upstream.predict_long(state, QUESTIONS)
            ours = _decide(engine, "english", state, QUESTIONS)
            _assert_answers(ours, theirs)
            unbinned = _decide(sides.engines["windows"], "english", state, QUESTIONS)
            moved += msgspec.to_builtins(ours.answers) != msgspec.to_builtins(unbinned.answers)
    assert moved  # the map picked another window somewhere
