"""Label files for `decidealot calibrate`: JSON lines in von-sdk 1.3.7's `von calibrate` format
(docs/models.md shows each kind of row). Each row's question is checked by the rules a
request's questions meet, so a row the service would refuse is an error naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from decidealot.contract import (
    ChoiceQuestion,
    Json,
    Labelled,
    NoulQuestion,
    Question,
    ScoreQuestion,
)
from decidealot.validation.requests import question_issues

T = TypeVar("T")

_TRUE = ("yes", "true", "1")
_FALSE = ("no", "false", "0")


class LabelError(ValueError):
    """A label file that cannot be read; the message names the file and line."""


def read_labels(path: Path) -> list[Labelled]:
    """Every row of the label file at `path`; `LabelError` at the first bad one."""
    return read_json_lines(path, row, LabelError)


def read_json_lines(
    path: Path,
    parse: Callable[[Json, int], T],
    error: type[ValueError],
    *,
    comments: bool = False,
) -> list[T]:
    """`parse(value, line)` of every non-blank line of the JSON-lines file at `path` (lines
    starting with `#` skipped too, with `comments`); `error` naming `file:line` at the first
    line that is no JSON or that `parse` refuses with a `ValueError`."""
    try:
        with path.open(encoding="utf-8") as stream:
            parsed = list(_parsed(path, stream, parse, error, comments))
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not parsed:
        raise error(f"{path}: no rows")
    return parsed


def _parsed(
    path: Path,
    lines: Iterator[str],
    parse: Callable[[Json, int], T],
    error: type[ValueError],
    comments: bool,
) -> Iterator[T]:
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or (comments and text.startswith("#")):
            continue
        try:
            yield parse(json.loads(text), number)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise error(f"{path}:{number}: nested too deeply") from None
        except ValueError as exc:
            raise error(f"{path}:{number}: {exc}") from None


def row(raw: Json, line: int) -> Labelled:
    """One parsed line (`line` counts from 1); `ValueError` saying what is wrong with it."""
    if not isinstance(raw, dict):
        raise ValueError("a row must be a JSON object")
    if "state" not in raw or "gold" not in raw:
        raise ValueError("needs 'state' and 'gold'")
    state = raw["state"]
    if not isinstance(state, str | dict | list):
        raise ValueError("state must be a string, an object or an array")
    spec = raw.get("question")
    if spec is None:
        if "choices" not in raw:
            raise ValueError("needs 'question' or the shorthand 'choices'")
        choices = raw["choices"]
        if isinstance(choices, list):
            if not all(isinstance(c, str) for c in choices):
                raise ValueError("choices as a list must hold labels (strings)")
            choices = {c: c for c in choices}
        spec = {"type": "choice", "instructions": raw.get("instructions", ""), "criteria": choices}
    question, issues = question_issues(spec)
    if question is None:
        first = issues[0]
        where = ".".join(str(part) for part in ["question", *first.loc])
        raise ValueError(f"{where}: {first.msg}")
    return Labelled(line, state, question, gold_index(question, raw["gold"]))


def gold_index(question: Question, gold: Json) -> int:
    """`gold`'s position among the question's answers (see `Labelled.gold`)."""
    if isinstance(question, ChoiceQuestion):
        labels = list(question.criteria)
        if not isinstance(gold, str) or gold not in labels:
            raise ValueError(f"gold {gold!r} is not one of the criteria's labels {labels}")
        return labels.index(gold)
    if isinstance(question, ScoreQuestion):
        levels = len(question.criteria)
        if isinstance(gold, bool) or not isinstance(gold, int | str):
            raise ValueError(f"score gold must be a level index, got {gold!r}")
        try:
            level = int(gold)
        except ValueError:
            raise ValueError(f"score gold must be a level index, got {gold!r}") from None
        if not 0 <= level < levels:
            raise ValueError(f"score gold {level} is outside 0..{levels - 1}")
        return level
    assert isinstance(question, NoulQuestion)
    truth = str(gold).strip().lower()
    if truth in _TRUE:
        return 1
    if truth in _FALSE:
        return 0
    raise ValueError(f"noul gold must be yes/true/1 or no/false/0, got {gold!r}")
