"""The labelled rows `decidealot evaluate` reads: JSON lines in laya-evals' format
(`{state, questions, expected}`, with optional `tags` and `language`) or in von calibrate's
(`{state, question, gold}`, the calibrate command's; its question id is the question's type),
one format per line. Every question is checked by the rules a request's questions meet and every
expected answer against its question, so a bad row is an error naming `file:line` before any
model runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import msgspec

from decidealot.contract import ChoiceQuestion, Json, NoulQuestion, Question, ScoreQuestion
from decidealot.validation import labels
from decidealot.validation.requests import question_issues


class RowError(ValueError):
    """A data file or row that cannot be evaluated; the message names the file and line."""


@dataclass(frozen=True)
class EvalRow:
    """One labelled row: what is asked (as sent on the wire) and the expected answers."""

    line: int
    state: Json
    questions: dict[str, Json]  # question id -> its JSON body, as the request carries it
    expected: dict[str, Json]  # question id -> a choice label, a noul bool or a score number
    tags: tuple[str, ...] = ()
    language: str | None = None


def read_rows(path: Path) -> list[EvalRow]:
    """Every row of the file at `path`; `RowError` at the first bad one. Blank lines and lines
    starting with `#` are skipped, as laya-evals skips them."""
    return labels.read_json_lines(path, parse_row, RowError, comments=True)


def parse_row(raw: Json, line: int) -> EvalRow:
    """One parsed row; `ValueError` saying what is wrong with it."""
    if not isinstance(raw, dict):
        raise ValueError("a row must be a JSON object")
    if "questions" in raw or "expected" in raw:
        return _laya_row(raw, line)
    if "gold" in raw:
        return _label_row(raw, line)
    raise ValueError(
        "needs 'questions' and 'expected' (laya-evals' format) or 'question' and 'gold' "
        "(von calibrate's)"
    )


def _laya_row(raw: dict[str, Json], line: int) -> EvalRow:
    for key in ("state", "questions", "expected"):
        if key not in raw:
            raise ValueError(f"needs {key!r}")
    state, questions, expected = raw["state"], raw["questions"], raw["expected"]
    if not isinstance(state, str | dict | list):
        raise ValueError("state must be a string, an object or an array")
    if not isinstance(questions, dict) or not questions:
        raise ValueError("questions must be a non-empty object of question id to question")
    if not isinstance(expected, dict) or not expected:
        raise ValueError("expected must be a non-empty object keyed by question id")
    unknown = sorted(set(expected) - set(questions))
    if unknown:
        raise ValueError(f"expected names unknown question(s): {', '.join(unknown)}")
    for qid, value in expected.items():
        question = _question(questions[qid], f"questions.{qid}")
        _check_expected(question, value, f"expected.{qid}")
    for qid, body in questions.items():
        if qid not in expected:
            _question(body, f"questions.{qid}")
    tags = raw.get("tags") or []
    if not isinstance(tags, list | tuple):
        raise ValueError("tags must be a list")
    language = raw.get("language")
    return EvalRow(
        line,
        state,
        dict(questions),
        dict(expected),
        tuple(str(tag) for tag in tags),
        None if language is None else str(language),
    )


def _label_row(raw: dict[str, Json], line: int) -> EvalRow:
    labelled = labels.row(raw, line)
    question = labelled.question
    body = {k: v for k, v in msgspec.to_builtins(question).items() if v is not None}
    if isinstance(question, ChoiceQuestion):
        expected: Json = list(question.criteria)[labelled.gold]
    elif isinstance(question, NoulQuestion):
        expected = labelled.gold == 1
    else:
        expected = labelled.gold
    qid = body["type"]  # its one question has no name: rows are tabled by question type
    return EvalRow(line, labelled.state, {qid: body}, {qid: expected})


def _question(body: Json, where: str) -> Question:
    question, issues = question_issues(body)
    if question is None:
        first = issues[0]
        raise ValueError(f"{'.'.join(str(part) for part in [where, *first.loc])}: {first.msg}")
    return question


def _check_expected(question: Question, value: Json, where: str) -> None:
    if isinstance(question, ChoiceQuestion):
        options = list(question.criteria)
        if not isinstance(value, str) or value not in options:
            raise ValueError(f"{where}: {value!r} is not one of the criteria's labels {options}")
    elif isinstance(question, NoulQuestion):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: a noul's expected answer is true or false, got {value!r}")
    else:
        assert isinstance(question, ScoreQuestion)
        top = len(question.criteria) - 1
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not 0 <= value <= top:
            raise ValueError(f"{where}: a score's expected answer is a number in 0..{top}")


# -- the run's identity -------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """The sha256 of the data file's bytes: the dataset's identity, where its path is a name."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(65536), b""):
            digest.update(block)
    return digest.hexdigest()


def questions_sha256(examples: list[EvalRow]) -> str:
    """laya-evals' `questions_fingerprint`: a hash of every distinct question asked (id, type,
    instructions as the model reads them, labels, criteria, option order), so two reports on
    the same questions carry the same one whichever tool wrote them."""
    schemas = set()
    for each in examples:
        for qid, body in each.questions.items():
            body = body if isinstance(body, dict) else {}
            instructions = body.get("instructions")
            if not isinstance(instructions, str):
                instructions = json.dumps(instructions, ensure_ascii=False)
            hashed = {
                "qid": qid,
                "type": body.get("type"),
                "instructions": instructions,
                "labels": body.get("labels"),
                "criteria": body.get("criteria"),
            }
            if "option_order" in body:
                hashed["option_order"] = body["option_order"]
            schemas.add(json.dumps(hashed, separators=(",", ":"), ensure_ascii=False, default=str))
    digest = hashlib.sha256()
    for schema in sorted(schemas):
        digest.update(schema.encode("utf-8") + b"\n")
    return digest.hexdigest()
