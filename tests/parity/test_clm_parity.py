"""CLM parity with upstream `contrastive-lm` 0.1.0 on random heads in its file format.

Both sides embed through the same deterministic HTTP endpoint: upstream's own `Engine` with
its `requests` embedder, and our provider with the in-process engine. The encoder inputs must
be identical call for call, and the answers must agree to 1e-5. On CUDA (skipped without a GPU)
both heads run there, in fp32 as upstream runs them, to the same tolerance.

A choice is the most probable option, the first in input order on an exact tie, on both sides
(upstream's rule: `clm.schema.answer_from_probs`). The two sides' float32 matrix products sum
in orders that depend on the CPU's kernels, so two options tied to the last bit on one side may
differ in the last bit on the other (on an AMD EPYC, 4e-10 apart): then, and only then, the
choices may differ, and only between options whose probabilities are within the tolerance of
each other on both sides.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import msgspec
import pytest
import torch
from clm.embedder import Embedder
from clm.engine import Engine as UpstreamEngine
from clm.schema import answer_from_probs, build_pairs

from decidealot.contract import (
    ChoiceQuestion,
    Json,
    NoulQuestion,
    Question,
    ScoreQuestion,
    SystemOneRequest,
)
from decidealot.jobs import EngineSpec, Job
from decidealot.providers.clm.descriptor import SELECTORS
from decidealot.providers.clm.gateway.encoder_client import EncoderClient
from decidealot.providers.clm.gateway.provider import ClmProvider
from decidealot.providers.clm.render import option_keys, render_questions
from decidealot.providers.clm.tiny import build_clm_head
from decidealot.providers.clm.worker.engine import HeadFileError, confidence, create
from decidealot.providers.engine.planner import run_together
from decidealot.providers.worker.readout import answer_from_probabilities
from tests.support.clm_runner import clm_runtime
from tests.support.decide import Deciding
from tests.support.devices import DEVICES, assert_fp32_matmul_is_ieee
from tests.support.fake_embeddings import FakeEmbeddings

WIDTH = 16
TOLERANCE = 1e-5

HEADS = {
    "gelu-layernorm": {"depth": 3, "activation": "gelu", "layernorm": True},
    "silu-residual-clamped": {
        "depth": 4,
        "activation": "silu",
        "residual": True,
        "layernorm": False,
        "logit_scale": 5.0,
    },
    "relu-shallow": {"depth": 2, "activation": "relu", "layernorm": False},
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings(WIDTH).start()
    yield server
    server.stop()


# -- generated requests ----------------------------------------------------------------------

_WORDS = ["refund", "Ana", "charged twice!", "  padded  ", "línea\nsegunda", "日本語", "", "ok"]
_NUMBERS = [0, 3, -7, 1.0, 0.1, 1e-05, 1e16, -2.5, 12345678901234567890]


def _scalar(rng: random.Random) -> Json:
    pick = rng.random()
    if pick < 0.45:
        return rng.choice(_WORDS)
    if pick < 0.7:
        return rng.choice(_NUMBERS)
    if pick < 0.85:
        return rng.choice([True, False])
    return None


def _value(rng: random.Random, depth: int = 0) -> Json:
    pick = rng.random()
    if depth >= 3 or pick < 0.5:
        return _scalar(rng)
    if pick < 0.75:
        return {
            f"k{i}_{rng.choice(_WORDS[:3])}": _value(rng, depth + 1)
            for i in range(rng.randint(0, 3))
        }
    return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _instructions(rng: random.Random) -> Json:
    return rng.choice(
        [
            None,
            "",
            "Is this urgent?",
            _value(rng, 1),
            {"task": "Route it", "rules": ["a", {"b": 1}]},
        ]
    )


def _question(rng: random.Random) -> Question:
    kind = rng.choice(["choice", "score", "noul"])
    instructions = _instructions(rng)
    if kind == "choice":
        keys = rng.sample(["billing", "tech", "other", "Refund", "deny", "x"], rng.randint(1, 5))
        return ChoiceQuestion(criteria={k: _value(rng) for k in keys}, instructions=instructions)
    if kind == "score":
        levels = [_value(rng) for _ in range(rng.randint(2, 5))]
        return ScoreQuestion(criteria=levels, instructions=instructions)
    criteria = rng.choice(
        [
            None,
            {},
            {"true": _value(rng)},
            {"false": "", "true": _value(rng)},
            {"false": _value(rng), "true": None},
        ]
    )
    return NoulQuestion(instructions=instructions, criteria=criteria)


def _request(rng: random.Random) -> tuple[SystemOneRequest, float | None]:
    state = rng.choice(
        [
            rng.choice(_WORDS),
            _value(rng),
            {"customer": "Ana", "n": 3, "vip": True},
            [_value(rng), "second line"],
        ]
    )
    if not isinstance(state, str | dict | list):
        state = str(state)
    questions = {f"q{i}": _question(rng) for i in range(rng.randint(1, 4))}
    temperature = rng.choice([None, 1.0, 0.05, 0.8, 1.7, 25.0, 100.0])
    config = {} if temperature is None else {"temperature": temperature}
    return SystemOneRequest(
        model="clm", state=state, questions=questions, config=config
    ), temperature


def _upstream_questions(request: SystemOneRequest) -> dict[str, dict[str, Json]]:
    return {name: msgspec.to_builtins(q) for name, q in request.questions.items()}


def _first_most_probable(probabilities: dict[str, float]) -> str:
    """Upstream's choice: the most probable option, the first in input order on a tie."""
    return max(probabilities, key=probabilities.__getitem__)


def _assert_same_choice(ours: dict[str, Json], theirs: dict[str, Json]) -> None:
    """Each side chose by the rule on its own probabilities; where the choices differ, the two
    options are a tie within float noise on both sides, not a different answer."""
    for side in (ours, theirs):
        assert side["choice"] == _first_most_probable(side["probabilities"])
    if ours["choice"] != theirs["choice"]:
        for side in (ours, theirs):
            p = side["probabilities"]
            assert abs(p[ours["choice"]] - p[theirs["choice"]]) <= TOLERANCE, (ours, theirs)


def _assert_close(ours: dict[str, Json], theirs: dict[str, Json]) -> None:
    assert ours.keys() == theirs.keys()
    for name, mine in ours.items():
        other = theirs[name]
        assert mine.keys() == other.keys(), name
        for key, value in mine.items():
            if key == "choice":
                _assert_same_choice(mine, other)
            elif isinstance(value, float):
                assert value == pytest.approx(other[key], abs=TOLERANCE), (name, key)
            elif key == "probabilities":
                assert value.keys() == other[key].keys()
                for label, p in value.items():
                    assert p == pytest.approx(other[key][label], abs=TOLERANCE), (name, label)
            else:
                assert value == other[key], (name, key)


# -- tests -----------------------------------------------------------------------------------


def test_rendering_matches_upstream_build_pairs() -> None:
    rng = random.Random(7)
    for _ in range(300):
        request, _ = _request(rng)
        pairs = build_pairs(request.state, _upstream_questions(request))
        for name, rendered in render_questions(request.state, request.questions):
            expected_state, expected_keys, expected_texts = pairs[name]
            assert rendered.state_text == expected_state
            assert option_keys(request.questions[name]) == expected_keys
            assert [c.text for c in rendered.candidates] == expected_texts


@pytest.mark.parametrize(
    "probabilities",
    [[0.5, 0.5], [0.25, 0.375, 0.375], [0.2] * 5, [0.375, 0.25, 0.375], [0.1, 0.2, 0.3, 0.4]],
)
def test_exact_ties_go_to_the_first_option_as_upstream(probabilities: list[float]) -> None:
    labels = ["x", "Refund", "billing", "tech", "other"][: len(probabilities)]
    question = ChoiceQuestion(criteria=dict.fromkeys(labels, "criterion"))
    ours = answer_from_probabilities(question, probabilities, confidence, true_index=1)
    theirs = answer_from_probs(msgspec.to_builtins(question), labels, probabilities)
    assert msgspec.to_builtins(ours) == theirs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_name", list(HEADS))
async def test_answers_match_upstream_engine(
    head_name: str, device: str, fake: FakeEmbeddings, tmp_path: Path
) -> None:
    head = build_clm_head(
        tmp_path / "head.pt", hidden=WIDTH, seed=len(head_name), **HEADS[head_name]
    )
    upstream = UpstreamEngine(
        embedder=Embedder(url=f"{fake.url}/v1/embeddings", model="qwen3-8b", cache_size=0),
        checkpoint=str(head),
        device=device,
        action_cache="0",
    )
    encoder = EncoderClient(fake.url, "qwen3-8b", width=WIDTH, cache_size=0)
    if device != "cpu":
        assert_fp32_matmul_is_ieee()
    runner = clm_runtime(head, width=WIDTH, device=device)
    provider = Deciding(ClmProvider(encoder, runner, selectors=SELECTORS, max_text_bytes=8192))
    rng = random.Random(head_name)
    try:
        for _ in range(40):
            request, temperature = _request(rng)
            fake.reset()
            ours = await provider.decide("clm", request)
            our_calls = list(fake.calls)
            fake.reset()
            theirs = upstream.answer(
                request.state, _upstream_questions(request), temperature=temperature or 1.0
            )
            assert our_calls == fake.calls  # the same encoder inputs, call for call
            assert ours.model == "clm-0.1-8b"
            assert ours.usage.input_tokens == theirs["usage"]["input_tokens"]
            _assert_close(msgspec.to_builtins(ours.answers), theirs["answers"])
    finally:
        await encoder.close()


def _spec(head: Path, width: int = WIDTH, device: str = "cpu") -> EngineSpec:
    return EngineSpec(
        factory="decidealot.providers.clm.worker.engine:create",
        checkpoints={"clm-0.1-8b": str(head)},
        options={"width": width},
        device=device,
    )


def _job(request: SystemOneRequest, rng: random.Random) -> Job:
    rows = sum(1 + len(option_keys(q)) for q in request.questions.values())
    vectors = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rng.randint(0, 99)))
    return Job(
        checkpoint="clm-0.1-8b",
        state=request.state,
        questions=request.questions,
        config=request.config,
        vectors=vectors.numpy().tobytes(),
        vector_index=list(range(rows)),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_batched_jobs_answer_exactly_as_alone(device: str, tmp_path: Path) -> None:
    engine = create(_spec(build_clm_head(tmp_path / "head.pt", hidden=WIDTH), device=device))
    rng = random.Random(3)
    jobs = [_job(_request(rng)[0], rng) for _ in range(6)]
    together = run_together(engine, [engine.prepare(job) for job in jobs])
    for job, batched in zip(jobs, together, strict=True):
        alone = run_together(engine, [engine.prepare(job)])[0]
        if device == "cpu":
            assert msgspec.to_builtins(batched) == msgspec.to_builtins(alone)  # to the bit
        else:  # cuBLAS may pick another kernel, summing in another order, per batch size
            _assert_close(msgspec.to_builtins(batched.answers), msgspec.to_builtins(alone.answers))
        assert batched.input_tokens == 0


def test_vectors_that_do_not_fit_the_questions_are_rejected(tmp_path: Path) -> None:
    engine = create(_spec(build_clm_head(tmp_path / "head.pt", hidden=WIDTH)))
    request, _ = _request(random.Random(1))
    job = _job(request, random.Random(1))
    short = msgspec.structs.replace(job, vectors=job.vectors[:-4])
    with pytest.raises(ValueError, match="vector bytes"):
        engine.prepare(short)


def test_head_refused_by_weights_only_loading_fails_loudly(tmp_path: Path) -> None:
    path = tmp_path / "pickled.pt"
    torch.save({"cfg": {"width": 4, "depth": 2}, "extra": Fraction(1, 3)}, path)
    with pytest.raises(HeadFileError, match="weights-only"):
        create(_spec(path))


def test_head_for_another_encoder_width_fails_at_creation(tmp_path: Path) -> None:
    head = build_clm_head(tmp_path / "head.pt", hidden=WIDTH)
    with pytest.raises(HeadFileError, match="expects 16-wide vectors; the encoder gives 4096"):
        create(_spec(head, width=4096))


def test_head_with_mismatched_weights_fails_at_creation(tmp_path: Path) -> None:
    head = build_clm_head(tmp_path / "head.pt", hidden=WIDTH)
    data = torch.load(head, weights_only=True)
    data["cfg"]["width"] = 32
    torch.save(data, head)
    with pytest.raises(HeadFileError, match="does not match its cfg"):
        create(_spec(head))


def test_logit_scale_is_clamped_at_100(tmp_path: Path) -> None:
    from decidealot.providers.clm.worker.engine import load_heads

    assert load_heads(build_clm_head(tmp_path / "a.pt", logit_scale=6.0), "cpu").scale == 100.0
    low = load_heads(build_clm_head(tmp_path / "b.pt", logit_scale=2.0), "cpu").scale
    assert low == pytest.approx(math.exp(2.0), rel=1e-6)
