"""Von states past the 8192-token window, against the installed von-sdk 1.3.7 backend.

Upstream cuts such a state in the middle at its default `VON_MAX_STATE_TOKENS` (8192), decodes
the kept tokens, and tokenises the packed text again; the row it reads may then be longer than
the cut promised (a character split at the cut, `[SEP]` literals escaped by the packing). These
tests send long states in English, Hindi, Chinese and Arabic, as strings, arrays and objects,
to both attention modes with the digit split on and off, and want the same answers (within
1e-4), the same truncation and the same `usage.input_tokens`. The 422 is left for instructions
and options that cannot fit by themselves.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from decidealot.contract import Question
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.planner import run_together
from decidealot.providers.von.tiny import build_von_checkpoint
from decidealot.providers.von.worker.engine import VonEngine, create
from decidealot.providers.von.worker.model import WINDOW
from tests.support.von_answers import assert_same

VARIANTS: dict[str, dict[str, Any]] = {
    "independent-digits": {"independent_options": True, "digit_split": True},
    "independent": {"independent_options": True, "digit_split": False, "seed": 1},
    "plain-digits": {"independent_options": False, "digit_split": True, "seed": 2},
    "plain": {"independent_options": False, "digit_split": False, "seed": 3},
}

SENTENCES: dict[str, tuple[str, ...]] = {
    "english": (
        "The customer asked for a refund of 1250 dollars on order 84213.",
        "Support answered on 2026-09-22 that the payment was sent twice.",
        "The account holds protected records and needs an audit first.",
        "Shipping was late by 12 days and the invoice lists 3 items.",
    ),
    "hindi": (
        "मेरा ऑर्डर 42 दिन से नहीं आया।",
        "कृपया मेरे 1250 रुपये वापस करें।",
        "ग्राहक ने दो बार भुगतान किया है।",
        "यह खाता सुरक्षित रिकॉर्ड रखता है।",
    ),
    "chinese": (
        "我的订单 84213 还没有到。",
        "请退还 300 元的重复付款。",
        "客服在 2026 年 9 月回复了邮件。",
        "这个账户保存着受保护的记录。",
    ),
    "arabic": (
        "طلبي رقم 84213 لم يصل بعد.",
        "أريد استرداد 75 دينارا دفعتها مرتين.",
        "رد فريق الدعم في 22 سبتمبر.",
        "هذا الحساب يحتوي على سجلات محمية.",
    ),
}
STATE_TOKENS = 9000
"""Every state tokenises to more than this, past the window even with no question at all."""


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Any, VonEngine]]]:
    """Per variant: upstream's backend at its default state limit, and our engine."""
    from von.backends.option_marker_backend import OptionMarkerBackend

    root = tmp_path_factory.mktemp("von-long")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VON_CHAINS_DIR", "off")
        env.setenv("VON_NOUL_DECISION", "raw")
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("VON_DEVICE", "cpu")
        env.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        env.delenv("VON_CALIBRATION", raising=False)
        env.delenv("VON_MAX_STATE_TOKENS", raising=False)
        result = {}
        for name, kwargs in VARIANTS.items():
            path = build_von_checkpoint(root / name, size="long", **kwargs)
            upstream = OptionMarkerBackend(checkpoint_dir=str(path), device="cpu")
            upstream._get_model()
            assert upstream.max_state_tokens == WINDOW
            spec = EngineSpec(
                factory="decidealot.providers.von.worker.engine:create",
                checkpoints={"von-1.1": str(path)},
                options={"precision": "fp32"},  # parity is fp32's; auto may run bf16
                device="cpu",
            )
            result[name] = (upstream, create(spec))
        yield result


def _long_state(rng: random.Random, language: str, shape: str, tokenizer: Any) -> Any:
    """A state of `shape` in `language` whose text is longer than STATE_TOKENS tokens."""
    sentences: list[str] = []
    while True:
        sentence = rng.choice(SENTENCES[language])
        if rng.random() < 0.02:
            sentence += rng.choice([" [SEP]", " [MASK]"])  # escaped by packing: rows grow
        sentences.append(sentence)
        checked = len(sentences) % 64 == 0
        if checked and len(tokenizer("\n".join(sentences))["input_ids"]) > STATE_TOKENS:
            break
    if shape == "string":
        return " ".join(sentences)
    if shape == "array":
        return sentences
    return {f"note_{i}": sentence for i, sentence in enumerate(sentences)}


def _question(index: int) -> dict[str, Any]:
    """Choice, score and zero-shot noul in turn, so each readout sees a cut state."""
    kind = ("choice", "score", "noul")[index % 3]
    if kind == "choice":
        criteria = {"billing": "A payment or refund question", "shipping": None, "audit": "Audit"}
        return {"type": "choice", "instructions": "Route the ticket.", "criteria": criteria}
    if kind == "score":
        levels = ["routine", {"what": "important", "examples": ["a refund"]}, "urgent"]
        return {"type": "score", "instructions": {"task": "How urgent is it?"}, "criteria": levels}
    return {"type": "noul", "instructions": "Was the payment sent twice?"}


CASES = [(language, shape) for language in SENTENCES for shape in ("string", "array", "object")]


def _variants_for(index: int) -> list[str]:
    """Each case runs in both modes, once with the digit split and once without, so every
    mode and every digit setting sees every language in every shape."""
    digits = index % 2 == 0
    return [
        "independent-digits" if digits else "independent",
        "plain" if digits else "plain-digits",
    ]


@pytest.mark.parametrize(("language", "shape"), CASES, ids=[f"{lang}-{s}" for lang, s in CASES])
def test_long_states_are_cut_as_upstream_cuts_them(
    pairs: dict[str, tuple[Any, VonEngine]], language: str, shape: str
) -> None:
    index = CASES.index((language, shape))
    rng = random.Random(f"von-long-{language}-{shape}")
    for variant in _variants_for(index):
        upstream, ours = pairs[variant]
        state = _long_state(rng, language, shape, upstream._get_model().tokenizer)
        questions = {"q": _question(index)}
        theirs = upstream.evaluate(state, questions)
        assert theirs.truncation is not None and theirs.truncation["state_tokens"] > WINDOW
        job = Job("von-1.1", state, msgspec.convert(questions, dict[str, Question]))
        (decision,) = run_together(ours, [ours.prepare(job)])
        assert_same(decision.answers, decision.answers, theirs)
        assert decision.input_tokens == theirs.usage.input_tokens, variant
        _assert_reported(decision, theirs.truncation)


def test_a_cut_row_past_the_window_is_answered_as_upstream(
    pairs: dict[str, tuple[Any, VonEngine]],
) -> None:
    """`[SEP]` literals count one token in the state but several once escaped, so the cut
    row is longer than the window; upstream answers it, and so must we."""
    upstream, ours = pairs["independent-digits"]
    state = "Order [SEP] 12 shipped late. " * 2000
    questions = {"late": {"type": "noul", "instructions": "Is it late?"}}
    theirs = upstream.evaluate(state, questions)
    prepared = ours.prepare(Job("von-1.1", state, msgspec.convert(questions, dict[str, Question])))
    assert max(len(row.ids) for row in prepared.rows) > WINDOW
    (decision,) = run_together(ours, [prepared])
    assert_same(decision.answers, decision.answers, theirs)
    assert decision.input_tokens == theirs.usage.input_tokens > WINDOW


def _assert_reported(decision: Decision, truncation: dict[str, Any] | None) -> None:
    """`Decision.cuts` says what upstream's `truncation` says: as many questions cut, the
    worst one's state tokens and the tokens it kept."""
    if truncation is None:
        assert decision.cuts == []
        return
    assert len(decision.cuts) == truncation["questions_affected"]
    worst = max(decision.cuts, key=lambda cut: cut.total)
    assert (worst.total, worst.read) == (truncation["state_tokens"], truncation["kept_tokens"])


def test_a_cut_of_several_questions_is_reported_per_question(
    pairs: dict[str, tuple[Any, VonEngine]],
) -> None:
    upstream, ours = pairs["plain"]
    state = "The refund was sent twice. " * 1800
    questions = {f"q{i}": _question(i) for i in range(3)}
    theirs = upstream.evaluate(state, questions)
    job = Job("von-1.1", state, msgspec.convert(questions, dict[str, Question]))
    (decision,) = run_together(ours, [ours.prepare(job)])
    assert [cut.question for cut in decision.cuts] == ["q0", "q1", "q2"]
    _assert_reported(decision, theirs.truncation)


def test_refuse_names_the_tokens_and_the_room(pairs: dict[str, tuple[Any, VonEngine]]) -> None:
    upstream, _ = pairs["plain"]
    spec = EngineSpec(
        factory="decidealot.providers.von.worker.engine:create",
        checkpoints={"von-1.1": upstream.checkpoint_dir},
        device="cpu",
        options={"long_states": "refuse"},
    )
    refusing = create(spec)
    questions = {"late": {"type": "noul", "instructions": "Is it late?"}}
    short = Job("von-1.1", "It shipped late.", msgspec.convert(questions, dict[str, Question]))
    (decision,) = run_together(refusing, [refusing.prepare(short)])
    assert decision.cuts == []
    state = "Order 12 shipped late. " * 2000
    truncation = upstream.evaluate(state, questions).truncation
    with pytest.raises(RequestInvalid) as caught:
        refusing.prepare(Job("von-1.1", state, msgspec.convert(questions, dict[str, Question])))
    (issue,) = caught.value.issues
    assert issue.loc == ["state"] and issue.input is None
    assert f"{truncation['state_tokens']} tokens" in issue.msg
    assert f"room for {truncation['kept_tokens']}" in issue.msg
    assert "DECIDEALOT_LONG_STATES" in issue.msg


def test_only_instructions_that_cannot_fit_by_themselves_are_refused(
    pairs: dict[str, tuple[Any, VonEngine]],
) -> None:
    _, ours = pairs["plain"]
    long_state = "The refund was sent twice. " * 3000
    fits = " ".join(f"rule{i}" for i in range(WINDOW // 8))
    job = Job(
        "von-1.1",
        long_state,
        msgspec.convert({"ok": {"type": "noul", "instructions": fits}}, dict[str, Question]),
    )
    ours.prepare(job)  # long instructions that fit leave a short state: answered
    huge = " ".join(f"rule{i}" for i in range(WINDOW))
    questions = {"ok": {"type": "noul"}, "rules": {"type": "noul", "instructions": huge}}
    with pytest.raises(RequestInvalid) as caught:
        ours.prepare(Job("von-1.1", "short", msgspec.convert(questions, dict[str, Question])))
    (issue,) = caught.value.issues
    assert issue.loc == ["questions", "rules"]
    assert "instructions and criteria take" in issue.msg
    assert "by themselves" in issue.msg and str(WINDOW) in issue.msg
