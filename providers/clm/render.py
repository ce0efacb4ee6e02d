"""CLM's encoder inputs, rendered exactly as upstream `contrastive-lm` 0.1.0 renders them.
Pure Python: the gateway renders and bounds texts, the engine reads option keys and legends
from the same functions, so the two sides cannot disagree on a question's layout."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from decidealot.contract import ChoiceQuestion, Json, Loc, Question, ScoreQuestion

NOUL_KEYS = ("false", "true")
_NOUL_DEFAULTS = {"false": "No. This is false: ", "true": "Yes. This is true: "}


def to_text(value: Json, indent: int = 0) -> str:
    """Upstream's prose rendering: the heads were trained on `key: value` text, not JSON (a
    blank line between top-level fields, nested ones indented, arrays as `- item` lines)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    pad = " " * indent
    is_dict = isinstance(value, dict)
    labelled = [(f"{k}:", v) for k, v in value.items()] if is_dict else [("-", v) for v in value]
    lines = []
    for label, item in labelled:
        if isinstance(item, dict | list) and item:  # below its label, indented
            lines.append(f"{pad}{label}\n{to_text(item, indent + 2)}")
        else:
            lines.append(f"{pad}{label} {to_text(item)}")
    return ("\n\n" if is_dict and indent == 0 else "\n").join(lines)


def _absent(value: Json) -> bool:
    return value is None or value == ""


class Candidate(msgspec.Struct, frozen=True):
    text: str
    loc: Loc  # where the text came from, for a 422 naming the field


class RenderedQuestion(msgspec.Struct, frozen=True):
    state_text: str
    candidates: list[Candidate]  # one per option, in the order of `option_keys`


def option_keys(question: Question) -> list[str]:
    """A question's options in answer order (the order of its candidate vectors)."""
    if isinstance(question, ChoiceQuestion):
        return list(question.criteria)
    if isinstance(question, ScoreQuestion):
        return [str(level) for level in range(len(question.criteria))]
    return list(NOUL_KEYS)


def _candidates(question: Question) -> list[Candidate]:
    if isinstance(question, ChoiceQuestion):
        # The option's own description, else its key; nothing is prefixed.
        return [
            Candidate(key if _absent(desc) else to_text(desc), ["criteria", key])
            for key, desc in question.criteria.items()
        ]
    if isinstance(question, ScoreQuestion):
        return [
            Candidate(to_text(level), ["criteria", position])
            for position, level in enumerate(question.criteria)
        ]
    # `false: …`/`true: …`; a missing side defaults to a yes/no restatement of the question.
    statement = to_text(question.instructions).strip()
    criteria = question.criteria or {}
    rendered: list[Candidate] = []
    for key in NOUL_KEYS:
        desc = criteria.get(key)
        loc: Loc = ["criteria", key]
        if _absent(desc):
            desc = _NOUL_DEFAULTS[key] + statement if statement else key
            loc = ["instructions"] if statement else loc
        rendered.append(Candidate(f"{key}: {to_text(desc)}", loc))
    return rendered


def render_questions(
    state: Json, questions: dict[str, Question]
) -> Iterator[tuple[str, RenderedQuestion]]:
    """Each question rendered: the state's text first, the question last, as the head trained."""
    context = to_text(state).strip()
    for name, question in questions.items():
        asked = to_text(question.instructions).strip()
        state_text = f"{context}\n\n{asked}" if context and asked else (context or asked)
        yield name, RenderedQuestion(state_text, _candidates(question))


def score_legend(question: ScoreQuestion) -> dict[str, Json]:
    """Each level as the caller wrote it when a string, else its rendered text."""
    return {
        str(position): level if isinstance(level, str) else to_text(level)
        for position, level in enumerate(question.criteria)
    }
