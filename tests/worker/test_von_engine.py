"""The Von engine as the worker drives it (batching, usage, refusals, checkpoint loading) and the
gateway side Von's descriptor builds."""

from __future__ import annotations

import json
import pickle
import random
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from decidealot import registry
from decidealot.contract import (
    ChoiceAnswer,
    ChoiceQuestion,
    ModelInfo,
    NoulAnswer,
    NoulQuestion,
    Question,
    ScoreQuestion,
    SystemOneRequest,
)
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.planner import run_together
from decidealot.providers.gateway.checkpoint_provider import CheckpointProvider, only
from decidealot.providers.von.descriptor import SELECTORS
from decidealot.providers.von.worker.engine import VonEngine, create
from decidealot.providers.von.worker.model import WINDOW, VonCheckpointError
from decidealot.providers.von.worker.render import (
    NO_TEXT,
    YES_TEXT,
    instructions_text,
    pack,
    score_level_text,
)
from decidealot.service import Service, build_providers, lane_of
from tests.support.checkpoints import TinyCheckpoints
from tests.support.decide import Deciding, through_service
from tests.support.devices import DEVICES

MODES = {"independent": True, "plain": False}


@pytest.fixture(scope="session")
def von_dirs(tiny: TinyCheckpoints) -> dict[str, Path]:
    return {mode: tiny.von(independent_options=flag, seed=7) for mode, flag in MODES.items()}


@pytest.fixture(scope="session")
def engines(von_dirs: dict[str, Path]) -> dict[str, VonEngine]:
    return {mode: _engine(path) for mode, path in von_dirs.items()}


@pytest.fixture(scope="session", params=DEVICES)
def device_engines(
    request: pytest.FixtureRequest, von_dirs: dict[str, Path]
) -> dict[str, VonEngine]:
    """`engines` on CPU (the same instances), or the same checkpoints on the GPU."""
    if request.param == "cpu":
        return request.getfixturevalue("engines")
    return {mode: _engine(path, device=request.param) for mode, path in von_dirs.items()}


def _engine(path: Path, device: str = "cpu", **options: Any) -> VonEngine:
    """In fp32: these tests hold the engine to exact answers (bf16's: tests/worker/test_bf16.py)."""
    return create(
        EngineSpec(
            factory="decidealot.providers.von.worker.engine:create",
            checkpoints={"von-1.1": str(path)},
            preload=["von-1.1"],
            options={"precision": "fp32", **options},
            device=device,
        )
    )


def test_an_unknown_long_states_mode_is_refused(von_dirs: dict[str, Path]) -> None:
    path = next(iter(von_dirs.values()))
    with pytest.raises(ValueError, match=r"long_states must be one of \('cut', 'refuse'"):
        _engine(path, long_states="slide")


def _job(state: Any, questions: dict[str, Any]) -> Job:
    return Job("von-1.1", state, msgspec.convert(questions, dict[str, Question]))


def _random_job(rng: random.Random) -> Job:
    words = [
        "refund",
        "invoice",
        "account",
        "order",
        "late",
        "audit",
        "review",
        "urgent",
        "billing",
        "queue",
        "2026",
        "417",
    ]

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    questions: dict[str, Any] = {}
    for i in range(rng.randint(1, 3)):
        kind = rng.choice(["choice", "score", "noul"])
        if kind == "choice":
            criteria: Any = {w: text(rng.randint(1, 6)) for w in rng.sample(words, 3)}
        elif kind == "score":
            criteria = [text(rng.randint(1, 4)) for _ in range(rng.randint(2, 5))]
        else:
            criteria = rng.choice([None, {"true": text(3), "false": text(2)}])
        question = {"type": kind, "instructions": text(rng.randint(0, 6)) or None}
        if criteria is not None:
            question["criteria"] = criteria
        questions[f"q{i}"] = question
    return _job(text(rng.randint(1, 40)), questions)


def _run(engine: VonEngine, batch: list[Job]) -> list[Decision]:
    return run_together(engine, [engine.prepare(job) for job in batch])


def _flat(answer: Any) -> dict[str, float]:
    values = msgspec.to_builtins(answer)
    flat = {k: v for k, v in values.items() if isinstance(v, float)}
    flat |= {f"p.{k}": v for k, v in values.get("probabilities", {}).items()}
    return flat


# -- engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
def test_batched_jobs_answer_as_they_do_alone(
    device_engines: dict[str, VonEngine], mode: str
) -> None:
    engine = device_engines[mode]
    rng = random.Random(f"von-batch-{mode}")
    jobs = [_random_job(rng) for _ in range(12)]
    together = _run(engine, jobs)
    alone = [_run(engine, [job])[0] for job in jobs]
    assert len(together) == len(jobs)
    for batched, single in zip(together, alone, strict=True):
        assert batched.model == single.model == "von-1.1"
        assert batched.input_tokens == single.input_tokens
        assert list(batched.answers) == list(single.answers)
        for name, answer in single.answers.items():
            other = batched.answers[name]
            assert type(other) is type(answer)
            if isinstance(answer, ChoiceAnswer):
                assert other.choice == answer.choice
            for key, value in _flat(answer).items():
                assert _flat(other)[key] == pytest.approx(value, abs=1e-5), (name, key)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", list(MODES))
def test_concurrent_runs_answer_as_sequential_runs(
    von_dirs: dict[str, Path], mode: str, device: str
) -> None:
    """A worker may run several passes at once (one per core on CPU): runs from two threads at
    once, sharing the debias-row cache, give every job what a run of it alone gives."""
    rng = random.Random(f"von-threads-{mode}")
    jobs = [_random_job(rng) for _ in range(24)]
    shared = NoulQuestion(instructions="Is this about a refund?")
    jobs += [_job(f"ticket {i} about an invoice", {"n": shared}) for i in range(8)]
    sequential = [_run(_engine(von_dirs[mode], device), [job])[0] for job in jobs]
    engine = _engine(von_dirs[mode], device)  # fresh cache, so both threads fill it at once
    start = threading.Barrier(2)

    def run_share(share: range) -> dict[int, Decision]:
        start.wait()
        return {i: _run(engine, [jobs[i]])[0] for i in share}

    with ThreadPoolExecutor(2) as pool:
        shares = list(pool.map(run_share, [range(0, len(jobs), 2), range(1, len(jobs), 2)]))
    concurrent = {i: decision for share in shares for i, decision in share.items()}
    assert sorted(concurrent) == list(range(len(jobs)))
    for i, expected in enumerate(sequential):
        got = concurrent[i]
        assert got.input_tokens == expected.input_tokens
        for name, answer in expected.answers.items():
            assert _flat(got.answers[name]) == pytest.approx(_flat(answer), abs=1e-6), (i, name)


def test_a_checkpoint_loads_once_under_concurrent_first_jobs(
    von_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from decidealot.providers.von.worker import engine as engine_module

    loads: list[str] = []
    model_class = engine_module.VonModel

    def slow_model(directory: str, *args: Any) -> Any:
        loads.append(directory)
        time.sleep(0.2)  # both threads ask while the first load is under way
        return model_class(directory, *args)

    monkeypatch.setattr(engine_module, "VonModel", slow_model)
    engine = create(
        EngineSpec(
            factory="decidealot.providers.von.worker.engine:create",
            checkpoints={"von-1.1": str(von_dirs["plain"])},
        )
    )
    job = _job("a state", {"n": {"type": "noul"}})
    with ThreadPoolExecutor(2) as pool:
        prepared = list(pool.map(lambda _: engine.prepare(job), range(2)))
    assert loads == [str(von_dirs["plain"])]
    assert len(run_together(engine, prepared)) == 2


def test_answers_are_unrounded_and_legend_echoes_levels(engines: dict[str, VonEngine]) -> None:
    levels = ["low", {"what": "medium", "examples": ["a"]}, ["high", 3]]
    job = _job(
        "The queue is backing up after 3 failed deploys.",
        {
            "urgency": {"type": "score", "instructions": "How urgent?", "criteria": levels},
            "route": {"type": "choice", "criteria": {"ops": {"team": "ops"}, "dev": None}},
        },
    )
    (decision,) = _run(engines["plain"], [job])
    score = decision.answers["urgency"]
    assert score.legend == {"0": levels[0], "1": levels[1], "2": levels[2]}
    assert sum(score.probabilities.values()) == pytest.approx(1.0, abs=1e-6)
    assert score.score == pytest.approx(
        sum(int(k) * p for k, p in score.probabilities.items()), abs=1e-9
    )
    choice = decision.answers["route"]
    assert sum(choice.probabilities.values()) == pytest.approx(1.0, abs=1e-6)
    every = [*score.probabilities.values(), *choice.probabilities.values()]
    assert any(round(p, 4) != p for p in every)  # nothing is rounded to upstream's 4 places


def test_prepared_job_reports_rows_tokens_and_group(engines: dict[str, VonEngine]) -> None:
    engine = engines["independent"]
    prepared = engine.prepare(
        _job(
            "state",
            {
                "a": {
                    "type": "choice",
                    "instructions": "Pick.",
                    "criteria": {"x": "one", "y": "two"},
                },
                "b": {"type": "noul", "instructions": "Is it?"},
            },
        )
    )
    assert prepared.group == "von-1.1"
    lengths = [len(row.ids) for row in prepared.rows]
    assert len(lengths) == 3  # the zero-shot noul adds its no-state row
    assert [row.tokens for row in prepared.rows] == lengths
    assert prepared.input_tokens == sum(lengths)


def test_zero_shot_noul_counts_its_debias_pass(engines: dict[str, VonEngine]) -> None:
    engine = engines["plain"]
    model = engine._model("von-1.1")
    instructions = {"ask": "Does the state describe a refund?", "strict": True}
    zero_shot = NoulQuestion(instructions=instructions)
    explicit = NoulQuestion(instructions=instructions, criteria={"true": YES_TEXT})
    state = "Customer 5521 asks for a refund of order 77."
    (alone,) = run_together(engine, [engine.prepare(Job("von-1.1", state, {"n": zero_shot}))])
    (given,) = run_together(engine, [engine.prepare(Job("von-1.1", state, {"n": explicit}))])
    null_text = pack(
        model.tokenizer,
        "",
        instructions_text(instructions),
        [YES_TEXT, NO_TEXT],
        digit_split=model.calibration.digit_split,
    )
    assert alone.input_tokens - given.input_tokens == len(model.tokenizer(null_text)["input_ids"])
    assert isinstance(alone.answers["n"], NoulAnswer)
    assert alone.answers["n"].noul != given.answers["n"].noul  # the debias moved it


def test_criteria_beyond_the_window_are_refused_by_question(
    engines: dict[str, VonEngine],
) -> None:
    engine = engines["independent"]
    huge = " ".join(f"word{i}" for i in range(WINDOW))
    job = Job(
        "von-1.1",
        "secret state text",
        {
            "fine": ChoiceQuestion(criteria={"a": "short", "b": "also short"}),
            "too_long": ChoiceQuestion(criteria={"a": huge, "b": "short"}),
        },
    )
    with pytest.raises(RequestInvalid) as caught:
        engine.prepare(job)
    (issue,) = caught.value.issues
    assert issue.loc == ["questions", "too_long"]
    assert "by themselves" in issue.msg
    assert "secret" not in issue.msg


def test_long_state_is_cut_not_refused(engines: dict[str, VonEngine], von_dirs: dict) -> None:
    engine = _engine(von_dirs["plain"], max_state_tokens=32)
    state = "The audit record shows a refund. " * 200
    prepared = engine.prepare(_job(state, {"s": {"type": "score", "criteria": ["low", "high"]}}))
    assert len(prepared.rows[0].ids) < 80
    (decision,) = run_together(engine, [prepared])
    assert sum(decision.answers["s"].probabilities.values()) == pytest.approx(1.0, abs=1e-3)


def test_model_safetensors_is_not_read(von_dirs: dict[str, Path], tmp_path: Path) -> None:
    copy = Path(shutil.copytree(von_dirs["independent"], tmp_path / "ckpt"))
    (copy / "model.safetensors").unlink()
    job = _job("Order 12 shipped late.", {"n": {"type": "noul", "instructions": "Late?"}})
    original = _engine(von_dirs["independent"])
    stripped = _engine(copy)
    assert run_together(stripped, [stripped.prepare(job)]) == run_together(
        original, [original.prepare(job)]
    )


@pytest.mark.parametrize("damage", ["missing", "unreadable", "string flag"])
def test_checkpoint_without_usable_calibration_is_refused(
    von_dirs: dict[str, Path], tmp_path: Path, damage: str
) -> None:
    copy = Path(shutil.copytree(von_dirs["independent"], tmp_path / "ckpt"))
    calibration = copy / "marker_calibration.json"
    if damage == "missing":
        calibration.unlink()
    elif damage == "unreadable":
        calibration.write_text("{not json")
    else:
        data = json.loads(calibration.read_text())
        data["independent_options"] = "false"
        calibration.write_text(json.dumps(data))
    with pytest.raises(VonCheckpointError):
        _engine(copy)


def test_option_marker_weights_load_without_pickled_code(
    von_dirs: dict[str, Path], tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(von_dirs["plain"], tmp_path / "ckpt"))
    weights = torch.load(copy / "option_marker.pt", weights_only=True)
    weights["scorer.extra"] = Path("not a tensor")
    torch.save(weights, copy / "option_marker.pt")
    with pytest.raises(pickle.UnpicklingError):
        _engine(copy)


def test_score_levels_render_as_upstream_or_as_json_text() -> None:
    levels = [
        " plain ",
        {"what": "High", "examples": ["outage", "data loss"]},
        {"what": "Medium", "examples": []},
        {"label": "other", "rank": 2},
        ["a", {"z": 1, "b": None}],
    ]
    assert [score_level_text(level) for level in levels] == [
        "plain",
        "High Examples: outage, data loss",
        "Medium",
        '{"label": "other", "rank": 2}',
        '["a", {"z": 1, "b": null}]',
    ]


# -- provider ----------------------------------------------------------------------------------


class _FakeRunner:
    def __init__(self) -> None:
        self.jobs: list[Job] = []

    loaded = True

    async def submit(self, job: Job, sent: object = None) -> Decision:
        self.jobs.append(job)
        return Decision("von-1.1", {"n": NoulAnswer(noul=0.25)}, input_tokens=42)


async def test_provider_lists_the_four_von_selectors() -> None:
    provider = CheckpointProvider("von", _FakeRunner(), SELECTORS, only("von-1.1"))  # type: ignore[arg-type]
    assert provider.name == "von" and provider.local is True
    date = "2026-09-22"
    assert await provider.models() == [
        ModelInfo("von", "Von System One decisions served by the local Von 1.1 model.", date),
        ModelInfo("von-latest", "Alias for the current Von release.", date),
        ModelInfo("von-1.1", "Von 1.1 System One decision model.", date),
        ModelInfo("von-1.1.0", "Alias for the Von 1.1 point release.", date),
    ]


@pytest.mark.parametrize("selector", ["von", "von-latest", "von-1.1", "von-1.1.0"])
async def test_provider_runs_every_selector_on_the_one_checkpoint(selector: str) -> None:
    runner = _FakeRunner()
    provider = Deciding(CheckpointProvider("von", runner, SELECTORS, only("von-1.1")))  # type: ignore[arg-type]
    questions: dict[str, Question] = {
        "n": NoulQuestion(instructions="Is it late?"),
        "s": ScoreQuestion(criteria=["low", {"what": "high"}]),
    }
    request = SystemOneRequest(selector, {"order": 12}, questions)
    response = await provider.decide(selector, request)
    (job,) = runner.jobs
    assert job.checkpoint == "von-1.1"
    assert job.state == {"order": 12} and job.questions == questions
    assert response.model == "von-1.1"
    assert response.answers == {"n": NoulAnswer(noul=0.25)}
    assert response.usage.input_tokens == 42 and response.usage.output_tokens == 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_service_builds_a_worker_runtime_on_its_lane(tmp_path: Path, device: str) -> None:
    settings = registry.settings(
        von_checkpoint=tmp_path,
        torch_threads=3,
        device=device,
        laya_enabled=False,  # type: ignore[arg-type]
    )
    (provider,) = build_providers(settings)
    assert isinstance(provider, CheckpointProvider)
    runtime = provider.runtime
    spec = runtime.spec
    assert runtime.name == "von" and runtime.device == device
    assert spec.factory == "decidealot.providers.von.worker.engine:create"
    assert spec.checkpoints == {"von-1.1": str(tmp_path)}
    assert spec.torch_threads == 3
    lane = lane_of("von", runtime, settings)
    assert lane == (("cuda", "von") if device == "cuda" else ("local", "models"))

    default = registry.settings(model_dir=tmp_path / "models", laya_enabled=False, device="cpu")
    (provider,) = build_providers(default)
    assert provider.runtime.spec.checkpoints == {  # type: ignore[attr-defined]
        "von-1.1": str(tmp_path / "models" / "von-1.1")
    }


def test_provider_module_imports_no_torch() -> None:
    code = (
        "import sys, decidealot.providers.von.descriptor; "
        "bad = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
async def test_provider_answers_through_a_real_worker(
    von_dirs: dict[str, Path], engines: dict[str, VonEngine]
) -> None:
    settings = registry.settings(
        von_checkpoint=von_dirs["independent"],
        device="cpu",
        precision="fp32",  # the direct engine below runs fp32; auto may pick bf16 here
        torch_threads=1,
        provider_idle_unload_seconds=0,
        laya_enabled=False,
    )
    service = Service(settings)
    questions: dict[str, Question] = {
        "route": ChoiceQuestion(criteria={"billing": {"topic": "money"}, "tech": None}),
        "true": NoulQuestion(instructions=["Is", "it", "late?"]),
        "level": ScoreQuestion(criteria=["low", ["mid", 2], {"what": "high", "examples": ["x"]}]),
    }
    state = {"order": 12, "late": True}
    try:
        await service.start()
        response = await through_service(service, SystemOneRequest("von-latest", state, questions))
    finally:
        await service.close()
    engine = engines["independent"]
    (direct,) = run_together(engine, [engine.prepare(Job("von-1.1", state, questions))])
    assert response.model == "von-1.1"
    assert list(response.answers) == list(direct.answers)
    for name, answer in direct.answers.items():
        assert type(response.answers[name]) is type(answer)
        assert _flat(response.answers[name]) == pytest.approx(_flat(answer), abs=1e-6)
    assert response.usage.input_tokens == direct.input_tokens


def test_state_free_rows_are_cached_least_recently_used_first_out(
    von_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from decidealot.providers.von.worker import model as model_module

    monkeypatch.setattr(model_module, "SHARED_CACHE_ROWS", 2)
    model = _engine(von_dirs["plain"])._model("von-1.1")
    passes: list[tuple[int, ...]] = []
    score = model._pass

    def counting(rows: list[Any]) -> list[torch.Tensor]:
        passes.extend(tuple(row.ids) for row in rows)
        return score(rows)

    monkeypatch.setattr(model, "_pass", counting)
    ids = {name: model.tokenizer(name)["input_ids"] for name in ("a b", "c d", "e f")}
    rows = {name: model_module.VonRow(row, [1], shared=True) for name, row in ids.items()}
    first = model.logits([rows["a b"]])[0]
    for name in ("c d", "a b", "e f", "a b", "c d"):  # "c d" is the least recently used at "e f"
        model.logits([rows[name]])
    assert passes == [tuple(rows[name].ids) for name in ("a b", "c d", "e f", "c d")]
    assert torch.equal(model.logits([rows["a b"]])[0], first)
