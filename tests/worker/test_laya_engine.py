"""Laya engine behaviour: batching equals running alone, lazy loading, costs, errors."""

from __future__ import annotations

import random
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from decidealot import registry
from decidealot.contract import ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneRequest
from decidealot.jobs import EngineSpec, Job
from decidealot.providers.engine.planner import run_together
from decidealot.providers.laya.tiny import VARIANTS
from decidealot.providers.laya.worker import engine as engine_module
from decidealot.providers.laya.worker.engine import LayaEngine, create
from tests.support.checkpoints import TinyCheckpoints
from tests.support.decide import through_service
from tests.support.devices import DEVICES, autocast_tolerance

BATCH_TOLERANCE = 1e-5


@pytest.fixture(scope="session")
def checkpoints(tiny: TinyCheckpoints) -> dict[str, Path]:
    return tiny.laya_all(seeds={v: 10 + i for i, v in enumerate(VARIANTS)})


def _spec(
    checkpoints: dict[str, Path], preload: list[str] | None = None, device: str = "cpu"
) -> EngineSpec:
    return EngineSpec(
        factory="decidealot.providers.laya.worker.engine:create",
        checkpoints={k: str(p) for k, p in checkpoints.items()},
        preload=preload or [],
        options={"precision": "fp32"},  # exact answers here; bf16's: tests/worker/test_bf16.py
        device=device,
    )


@pytest.fixture(scope="session")
def engine(checkpoints: dict[str, Path]) -> LayaEngine:
    return create(_spec(checkpoints))


@pytest.fixture(scope="session", params=DEVICES)
def device_engine(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> LayaEngine:
    """`engine` on CPU (the same instance), or the same checkpoints on the GPU."""
    if request.param == "cpu":
        return request.getfixturevalue("engine")
    return create(_spec(checkpoints, device=request.param))


def _tolerance(engine: LayaEngine, checkpoint: str, fp32: float) -> float:
    """`fp32` on CPU; under CUDA autocast, padding a row differently may move its logits by
    a few ulps of the autocast dtype (tests/support/devices.py)."""
    dtype = engine._checkpoint(checkpoint).amp_dtype
    return fp32 if dtype == torch.float32 else autocast_tolerance(dtype)


def _job(checkpoint: str, state: object, questions: dict[str, object]) -> Job:
    request = msgspec.convert(
        {"model": "laya", "state": state, "questions": questions}, SystemOneRequest
    )
    return Job(checkpoint=checkpoint, state=request.state, questions=request.questions)


def _jobs(checkpoint: str, count: int, seed: int) -> list[Job]:
    """Jobs of very different lengths and option counts, so batching pads a lot."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        words = " ".join(
            rng.choice(["refund", "Konto", "заказ", "订单", "urgent", "the"])
            for _ in range(rng.randint(1, 90))
        )
        questions: dict[str, object] = {
            "route": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {f"team{j}": f"handles case {j}" for j in range(rng.randint(1, 9))},
            },
            "level": {
                "type": "score",
                "instructions": {"rubric": "urgency"},
                "criteria": ["low", "mid", "high"][: rng.randint(1, 3)],
            },
        }
        if i % 2:
            questions["flag"] = {
                "type": "noul",
                "criteria": {"true": "needs review", "false": None},
            }
        state = {"body": words} if i % 3 == 0 else [words, "last"] if i % 3 == 1 else words
        jobs.append(_job(checkpoint, state, questions))
    return jobs


def _flat(answer: object) -> dict[str, float]:
    if isinstance(answer, NoulAnswer):
        return {"noul": answer.noul}
    assert isinstance(answer, ChoiceAnswer | ScoreAnswer)
    return {**answer.probabilities, "confidence": answer.confidence}


@pytest.mark.parametrize("variant", VARIANTS)
def test_batch_equals_each_job_alone(variant: str, device_engine: LayaEngine) -> None:
    engine = device_engine
    jobs = _jobs(variant, 7, seed=len(variant))
    prepared = [engine.prepare(job) for job in jobs]
    tolerance = _tolerance(engine, variant, BATCH_TOLERANCE)
    batched = run_together(engine, prepared)
    assert len(batched) == len(jobs)
    for one, together in zip(prepared, batched, strict=True):
        alone = run_together(engine, [one])[0]
        assert together.model == alone.model == f"laya-{variant}"
        assert together.input_tokens == alone.input_tokens
        assert together.answers.keys() == alone.answers.keys()
        for name, answer in alone.answers.items():
            expected, got = _flat(answer), _flat(together.answers[name])
            assert got.keys() == expected.keys()
            for key, value in expected.items():
                assert got[key] == pytest.approx(value, abs=tolerance)
            if isinstance(answer, ChoiceAnswer):
                choice = together.answers[name].choice  # type: ignore[union-attr]
                assert choice == answer.choice or (
                    # under autocast only: a near tie may go either way
                    tolerance > BATCH_TOLERANCE
                    and expected[choice] >= expected[answer.choice] - 2 * tolerance
                )


def test_huge_batches_split_into_passes_with_equal_answers(
    engine: LayaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = [engine.prepare(job) for job in _jobs("english", 6, seed=7)]
    one_pass = run_together(engine, prepared)
    calls: list[int] = []
    forward = engine.forward

    def counting_forward(checkpoint: object, rows: list[object]) -> list[list[float]]:
        calls.append(len(rows))
        return forward(checkpoint, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "shape", engine.shape._replace(max_tokens=400))
    monkeypatch.setattr(engine, "forward", counting_forward)
    split = run_together(engine, prepared)
    assert len(calls) > 1 and sum(calls) == sum(len(p.rows) for p in prepared)
    for a, b in zip(one_pass, split, strict=True):
        assert a.input_tokens == b.input_tokens
        for name, answer in a.answers.items():
            expected, got = _flat(answer), _flat(b.answers[name])
            assert got == pytest.approx(expected, abs=BATCH_TOLERANCE)


def test_cpu_passes_hold_rows_of_similar_length(
    engine: LayaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = [engine.prepare(job) for job in _jobs("english", 8, seed=3)]
    passes: list[list[int]] = []
    forward = engine.forward

    def recording_forward(checkpoint: object, rows: list[object]) -> list[list[float]]:
        passes.append([len(row.ids) for row in rows])  # type: ignore[attr-defined]
        return forward(checkpoint, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "forward", recording_forward)
    run_together(engine, prepared)
    lengths = [n for one_pass in passes for n in one_pass]
    assert lengths == sorted(len(row.ids) for job in prepared for row in job.rows)
    assert len(passes) > 1
    for one_pass in passes:
        assert max(one_pass) * len(one_pass) - sum(one_pass) <= engine_module.CPU_PASS_COST


def test_prepare_reports_tokens_and_group(engine: LayaEngine) -> None:
    job = _job(
        "multilingual",
        "Mein Konto wurde zweimal belastet",
        {
            "a": {"type": "noul", "instructions": "Charged twice?"},
            "b": {
                "type": "choice",
                "instructions": "Team",
                "criteria": {"billing": None, "tech": ""},
            },
        },
    )
    prepared = engine.prepare(job)
    assert prepared.key == "multilingual" and prepared.group is engine._checkpoint("multilingual")
    assert prepared.input_tokens == sum(len(row.ids) for row in prepared.rows)
    decision = run_together(engine, [prepared])[0]
    assert decision.input_tokens == prepared.input_tokens
    answer = decision.answers["b"]
    assert isinstance(answer, ChoiceAnswer)
    assert answer.choice in ("billing", "tech")
    assert sum(answer.probabilities.values()) == pytest.approx(1.0)
    assert 0.0 <= answer.confidence <= 1.0


def test_score_legend_keeps_original_levels(engine: LayaEngine) -> None:
    levels = ["low", {"label": "mid", "sla": 4}, [1, 2]]
    job = _job(
        "english",
        {"ticket": "slow"},
        {
            "s": {"type": "score", "instructions": "How urgent?", "criteria": levels},
        },
    )
    answer = run_together(engine, [engine.prepare(job)])[0].answers["s"]
    assert isinstance(answer, ScoreAnswer)
    assert answer.legend == {"0": "low", "1": {"label": "mid", "sla": 4}, "2": [1, 2]}
    expected = sum(int(i) * p for i, p in answer.probabilities.items())
    assert answer.score == pytest.approx(expected)


def test_checkpoints_load_lazily_and_preload(checkpoints: dict[str, Path]) -> None:
    loads: list[str] = []
    engine = create(_spec(checkpoints, preload=["english"]), lambda it: loads.append(it.checkpoint))
    assert loads == ["english"]
    engine.prepare(_job("typed-decisions", "x", {"n": {"type": "noul"}}))
    assert loads == ["english", "typed-decisions"]


def test_concurrent_runs_answer_as_sequential_runs(device_engine: LayaEngine) -> None:
    """A worker may run several passes at once (one per core on CPU): runs from two threads at
    once give every job what a run of it alone gives (the same passes, so the same kernels:
    also to the bit under CUDA autocast)."""
    engine = device_engine
    jobs = _jobs("english", 24, seed=99)
    batches = [[engine.prepare(job) for job in jobs[i : i + 2]] for i in range(0, len(jobs), 2)]
    sequential = [run_together(engine, batch) for batch in batches]
    start = threading.Barrier(2)

    def run_share(share: list[int]) -> dict[int, list[Any]]:
        start.wait()
        return {i: run_together(engine, batches[i]) for i in share}

    with ThreadPoolExecutor(2) as pool:
        shares = list(pool.map(run_share, [range(0, len(batches), 2), range(1, len(batches), 2)]))
    concurrent = {i: decisions for share in shares for i, decisions in share.items()}
    assert sorted(concurrent) == list(range(len(batches)))
    for i, expected_batch in enumerate(sequential):
        for expected, got in zip(expected_batch, concurrent[i], strict=True):
            assert got.input_tokens == expected.input_tokens
            for name, answer in expected.answers.items():
                assert _flat(got.answers[name]) == pytest.approx(_flat(answer), abs=1e-6)


def test_a_checkpoint_loads_once_under_concurrent_first_jobs(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[str] = []
    load = engine_module.load_checkpoint

    def slow_load(path: str, *args: Any) -> Any:
        loads.append(path)
        time.sleep(0.2)  # both threads ask while the first load is under way
        return load(path, *args)

    monkeypatch.setattr(engine_module, "load_checkpoint", slow_load)
    engine = create(_spec(checkpoints))
    job = _job("english", "x", {"n": {"type": "noul"}})
    with ThreadPoolExecutor(2) as pool:
        prepared = list(pool.map(lambda _: engine.prepare(job), range(2)))
    assert loads == [str(checkpoints["english"])]
    assert len(run_together(engine, prepared)) == 2


def test_empty_questions_need_no_pass(engine: LayaEngine) -> None:
    job = Job(checkpoint="english", state="anything", questions={})
    decision = run_together(engine, [engine.prepare(job)])[0]
    assert decision.answers == {} and decision.input_tokens == 0


def test_unknown_or_unconfigured_checkpoint_is_refused(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="unknown Laya checkpoint"):
        create(EngineSpec(factory="f", checkpoints={"french": str(checkpoints["english"])}))
    engine = create(EngineSpec(factory="f", checkpoints={"english": str(checkpoints["english"])}))
    with pytest.raises(ValueError, match="not configured"):
        engine.prepare(_job("multilingual", "x", {"n": {"type": "noul"}}))


def test_an_unknown_long_states_mode_is_refused(checkpoints: dict[str, Path]) -> None:
    options = {"long_states": "slide"}
    english = {"english": str(checkpoints["english"])}
    with pytest.raises(ValueError, match=r"long_states must be one of \('cut', 'refuse'"):
        create(EngineSpec(factory="f", checkpoints=english, options=options))


@pytest.mark.parametrize("missing", ["encoder", "tokenizer"])
def test_checkpoint_without_encoder_or_tokenizer_fails(
    missing: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["english"], broken)
    shutil.rmtree(broken / missing)
    with pytest.raises(FileNotFoundError, match=missing):
        create(EngineSpec(factory="f", checkpoints={"english": str(broken)}, preload=["english"]))


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
async def test_provider_runs_in_a_real_worker(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """Gateway -> residency -> worker subprocess -> this engine, with the factory by name."""
    from decidealot.service import Service

    settings = registry.settings(
        device="cpu",
        torch_threads=1,
        model_dir=tmp_path,
        laya_english_checkpoint=checkpoints["english"],
        laya_multilingual_checkpoint=checkpoints["multilingual"],
        laya_typed_decisions_checkpoint=checkpoints["typed-decisions"],
        von_enabled=False,
    )
    service = Service(settings)
    questions = {"pay": {"type": "choice", "criteria": {"billing": "refunds", "tech": None}}}
    state = "Mein Konto wurde zweimal belastet, bitte helfen Sie mir."
    request = msgspec.convert(
        {"model": "laya", "state": state, "questions": questions}, SystemOneRequest
    )
    try:
        await service.start()
        response = await through_service(service, request)
    finally:
        await service.close()
    local = create(_spec(checkpoints))
    expected = run_together(local, [local.prepare(_job("multilingual", state, questions))])[0]
    assert response.model == "laya-multilingual"
    assert response.usage.input_tokens == expected.input_tokens
    got, want = response.answers["pay"], expected.answers["pay"]
    assert isinstance(got, ChoiceAnswer) and isinstance(want, ChoiceAnswer)
    assert got.choice == want.choice
    assert got.probabilities == pytest.approx(want.probabilities, abs=BATCH_TOLERANCE)
