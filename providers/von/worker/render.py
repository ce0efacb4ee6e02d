"""Von's input rendering (von.md §2): question texts, option texts, packing and the state cut,
reproducing von-sdk 1.3.7. Where the contract admits input upstream rejects or renders as
nothing, the nearest sensible text is used (absent instructions are upstream's "")."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from decidealot.contract import ChoiceQuestion, Json, NoulQuestion, Question, ScoreQuestion, State
from decidealot.providers.worker.tokenizer import FastTokenizer

YES_TEXT = "Yes, condition holds true."
NO_TEXT = "No, condition is false."

_DIGIT_RUN = re.compile(r"\d+")


def format_state(state: State) -> str:
    """Upstream's state text: dicts become `key: value` lines with Python `str` values."""
    if isinstance(state, str):
        return state
    if isinstance(state, dict):
        return "\n".join(f"{key}: {value}" for key, value in state.items())
    return str(state)


def json_text(value: Json) -> str:
    """A JSON value as the text the model reads: strings as is, containers as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=isinstance(value, dict))
    return str(value)


def instructions_text(instructions: Json) -> str:
    """Upstream requires instructions; a question without them is asked with an empty one."""
    return "" if instructions is None else json_text(instructions)


def _criterion_text(value: Json) -> str | None:
    return None if value is None else json_text(value)


def score_level_text(level: Json) -> str:
    """A level's text: upstream's `{"what", "examples"}` form, else the level as JSON text."""
    if isinstance(level, dict) and ("what" in level or "examples" in level):
        what = json_text(level.get("what", ""))
        examples = level.get("examples")
        if isinstance(examples, list):
            listed = ", ".join(json_text(example) for example in examples)
        else:
            listed = json_text(examples) if examples else ""
        return (what + (f" Examples: {listed}" if listed else "")).strip()
    return json_text(level).strip()


def noul_options(question: NoulQuestion) -> tuple[list[str], bool]:
    """`[yes, no]` texts and whether the caller gave either one (else the debias pass runs)."""
    criteria = question.criteria or {}
    true_text = _criterion_text(criteria.get("true"))
    false_text = _criterion_text(criteria.get("false"))
    explicit = bool(true_text or false_text)
    return [true_text or YES_TEXT, false_text or NO_TEXT], explicit


def option_texts(question: Question) -> list[str]:  # in marker order
    if isinstance(question, ChoiceQuestion):  # a truthy description replaces the label whole
        return [(_criterion_text(v) or label).strip() for label, v in question.criteria.items()]
    if isinstance(question, ScoreQuestion):
        return [score_level_text(level) for level in question.criteria]
    return noul_options(question)[0]


def split_digits(text: str) -> str:
    """Space out every digit run ("2026" -> "2 0 2 6"), as checkpoints with `digit_split` expect."""
    return _DIGIT_RUN.sub(lambda match: " ".join(match.group(0)), text)


def _neutralise(text: str, specials: Sequence[str]) -> str:
    """Break special-token literals with a zero-width joiner so user text cannot forge markers."""
    for special in specials:
        if special and special in text:
            text = text.replace(special, special[0] + "\u200d" + special[1:])
    return text


def pack(
    tokenizer: FastTokenizer,
    state: str,
    question: str,
    options: Sequence[str],
    *,
    digit_split: bool,
) -> str:
    """`<question> <state> [SEP] [MASK] opt0 [MASK] opt1 …`, one sequence for all options."""
    mask, sep = tokenizer.mask_token, tokenizer.sep_token
    state = _neutralise(state, (mask, sep))
    question = _neutralise(question, (mask, sep))
    options = [_neutralise(option, (mask, sep)) for option in options]
    prefix = f"{question} {state}".strip() if question else state.strip()
    markers = " ".join(f"{mask} {option.strip()}" for option in options)
    packed = f"{prefix} {sep} {markers}"
    return split_digits(packed) if digit_split else packed


def state_limit(options_length: int, *, window: int, max_state_tokens: int) -> int:
    """The state tokens a question leaves room for (upstream `_fit_state`'s `limit`)."""
    return max(16, min(max_state_tokens, window - options_length - 8))


def fit_state(tokenizer: FastTokenizer, state: str, state_ids: list[int], limit: int) -> str:
    """The middle cut out of a state too long for the window, as von-sdk cuts it (docs/models.md,
    "Von"): rules sit at a state's top, recent events at its bottom."""
    if len(state_ids) <= limit:
        return state
    head = int(limit * 0.6)
    tail = limit - head - 2
    return tokenizer.decode(state_ids[:head]) + " ... " + tokenizer.decode(state_ids[-tail:])
