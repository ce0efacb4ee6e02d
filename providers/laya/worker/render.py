"""Laya input rendering (laya.md §3): question -> option texts -> one encoder row of token ids.

Mirrors upstream `laya.common.build_head`/`build_sequence` and `Agent._to_internal` for the
sequential option layout. Pure Python: the tokenizer comes in as an `encode` callable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from decidealot.contract import ChoiceQuestion, Json, NoulQuestion, Question, ScoreQuestion, State
from decidealot.errors import RequestInvalid
from decidealot.providers.laya.calibration import QTYPE_NAMES

QTYPES = {name: i for i, name in enumerate(QTYPE_NAMES)}
OPTION_TOKEN_CAP = 48  # upstream keeps an option text's first 48 tokens (before its marker)

Encode = Callable[[Sequence[str]], list[list[int]]]  # texts -> ids, no special tokens


@dataclass(frozen=True, slots=True)
class Specials:  # the tokenizer facts rendering needs (laya.md §1.4)
    cls_id: int
    sep_id: int
    mask_id: int
    mask_text: str


@dataclass(frozen=True, slots=True)
class Budget:
    max_len: int
    head_max_len: int


@dataclass(frozen=True, slots=True)
class LayaRow:
    """One question's encoder row; it holds `state_read` of the state's `state_total` tokens."""

    ids: list[int]
    markers: list[int]
    qtype: int
    state_read: int
    state_total: int

    @property
    def tokens(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class LayaHead:
    """One question's half of its rows, `[CLS] <type> question: … [SEP] [MASK] option … [SEP]`
    (upstream `build_head`), and the state tokens it leaves room for."""

    ids: list[int]
    markers: list[int]
    qtype: int
    room: int


def criterion_text(value: Json) -> str:
    """Strings pass through; structured values become one-line JSON (`render_criterion`)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def serialize_state(state: State) -> str:
    """Upstream `serialize_state`: strings as-is, anything else as JSON with default separators."""
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False)


def instructions_text(name: str, question: Question) -> str:
    """The text after `<type> question: ` (`_to_internal`). A question without instructions, which
    upstream refuses, is asked by its name: the only text the caller gave saying what is decided."""
    if question.instructions is None:
        return name
    return serialize_state(question.instructions)


def option_texts(question: Question) -> list[str]:
    """Option texts in the caller's order; noul is always [false, true] (`render_options`)."""
    if isinstance(question, ChoiceQuestion):
        return [
            label if desc is None or desc == "" else f"{label}: {criterion_text(desc)}"
            for label, desc in question.criteria.items()
        ]
    if isinstance(question, ScoreQuestion):
        return [f"level {i}: {criterion_text(level)}" for i, level in enumerate(question.criteria)]
    assert isinstance(question, NoulQuestion)
    criteria = question.criteria or {}
    return [
        _noul_option("false", criteria.get("false"), "no, the statement does not hold"),
        _noul_option("true", criteria.get("true"), "yes, the statement holds"),
    ]


def _noul_option(label: str, description: Json, default: str) -> str:
    """A null or empty description reads as upstream's default sentence."""
    return f"{label}: {default if description in (None, '') else criterion_text(description)}"


def question_type(question: Question) -> str:
    return type(question).__struct_config__.tag  # type: ignore[return-value]


def state_ids(state: State, encode: Encode, specials: Specials) -> list[int]:
    """The state's tokens as upstream tokenises it: its text, `[MASK]` literals blanked."""
    return encode([serialize_state(state).replace(specials.mask_text, " ")])[0]


def render_heads(
    questions: dict[str, Question], encode: Encode, specials: Specials, budget: Budget
) -> list[LayaHead]:
    mask = specials.mask_text
    heads: list[str] = []
    options: list[list[str]] = []
    for name, question in questions.items():
        ins = instructions_text(name, question).replace(mask, " ")
        heads.append(f"{question_type(question)} question: {ins}")
        options.append([" " + text.replace(mask, " ") for text in option_texts(question)])
    encoded = encode([*heads, *(text for texts in options for text in texts)]) if heads else []
    head_ids, option_ids = encoded[: len(heads)], iter(encoded[len(heads) :])
    result = []
    for (name, question), head, texts in zip(questions.items(), head_ids, options, strict=True):
        spans = [[specials.mask_id, *next(option_ids)[:OPTION_TOKEN_CAP]] for _ in texts]
        result.append(_head(name, QTYPES[question_type(question)], head, spans, specials, budget))
    return result


def _head(
    name: str,
    qtype: int,
    head: list[int],
    spans: list[list[int]],
    specials: Specials,
    budget: Budget,
) -> LayaHead:
    """Upstream `build_head`: cap option spans, cap the instructions."""
    option_budget = budget.head_max_len - sum(len(span) for span in spans)
    if option_budget < 16:
        per_option = max(4, (budget.head_max_len - 16) // max(1, len(spans)))
        spans = [span[:per_option] for span in spans]
        option_budget = budget.head_max_len - sum(len(span) for span in spans)
    ids = [specials.cls_id, *head[: max(8, option_budget)], specials.sep_id]
    markers: list[int] = []
    for span in spans:
        markers.append(len(ids))
        ids.extend(span)
    ids.append(specials.sep_id)
    fitting = sum(1 for marker in markers if marker < budget.max_len)
    if fitting != len(markers):
        raise RequestInvalid.question(
            name,
            f"only {fitting} of its {len(markers)} option markers fit in the model's "
            f"{budget.max_len}-token input; use fewer or shorter options",
            loc=["criteria"],
        )
    return LayaHead(ids, markers, qtype, max(0, budget.max_len - len(ids) - 1))


def fill(
    head: LayaHead, state: list[int], keep_tail: bool, specials: Specials, budget: Budget
) -> LayaRow:
    """Upstream `build_sequence`: the head, what its room holds of the state, `[SEP]`."""
    room = head.room
    kept = state[max(0, len(state) - room) :] if keep_tail else state[:room]
    ids = [*head.ids, *kept, specials.sep_id][: budget.max_len]
    return LayaRow(ids, head.markers, head.qtype, len(kept), len(state))


def windows(state: list[int], heads: list[LayaHead], budget: Budget) -> list[list[int]]:
    """Upstream `Agent.predict_long`'s split with its defaults (`window_budget`), capped at the
    smallest room the questions leave; the last window reaches the state's end."""
    room = min(head.room for head in heads)
    if len(state) <= room:
        return [state]
    size = min(max(64, budget.max_len - budget.head_max_len - 8), room)
    step = max(1, size // 2)
    split: list[list[int]] = []
    start = 0
    while True:  # the last window reaches the end
        split.append(state[start : start + size])
        if start + size >= len(state):
            return split
        start += step
