"""TypeSafe's wire shapes: the request Jev sends and the checks every reply must pass.

The request is TypeSafe's official three-field body, built the way typesafe-sdk 0.7.5 sends
question objects (top-level nulls dropped, nulls inside `criteria` kept); `config` never leaves
the host. Replies decode into the contract's own structs, which drops upstream extras, and are
then checked against the questions asked: a caller never receives an answer our contract
forbids. Failure reasons are fixed phrases because upstream bodies can echo request content.
"""

from __future__ import annotations

import math

import msgspec

from decidealot.contract import (
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    Json,
    ModelInfo,
    ModelList,
    NoulAnswer,
    NoulQuestion,
    Question,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
)

SYSTEM_ONE_PATH = "/v1/systemone"
MODELS_PATH = "/v1/models"

# Expected scores are probability-weighted sums, so rounding may step just past the last level.
_SCORE_SLACK = 1e-6


class InvalidReply(Exception):
    """TypeSafe answered 2xx with a body the contract forbids; the reason quotes no content."""


def encode_request(model: str, request: SystemOneRequest) -> bytes:
    """TypeSafe's three-field body for `model`, the exact hosted name the caller selected."""
    body = {
        "state": request.state,
        "model": model,
        "questions": {name: _question_body(q) for name, q in request.questions.items()},
    }
    return msgspec.json.encode(body)


def _question_body(question: Question) -> dict[str, Json]:
    body: dict[str, Json] = {"type": type(question).__struct_config__.tag}
    if question.instructions is not None:
        body["instructions"] = question.instructions
    if question.criteria is not None:
        body["criteria"] = question.criteria
    return body


def decode_models(content: bytes) -> list[ModelInfo]:
    """TypeSafe's catalog, names exactly as listed; a repeated name keeps its first entry."""
    try:
        listing = msgspec.json.decode(content, type=ModelList)
    except msgspec.DecodeError:
        raise InvalidReply("the model list does not match TypeSafe's schema") from None
    models: dict[str, ModelInfo] = {}
    for model in listing.models:
        if not model.name:
            raise InvalidReply("the model list has an empty name")
        models.setdefault(model.name, model)
    return list(models.values())


def decode_answer(content: bytes, questions: dict[str, Question]) -> SystemOneResponse:
    """TypeSafe's answer to `questions`, in the order they were asked."""
    try:
        reply = msgspec.json.decode(content, type=SystemOneResponse)
    except msgspec.DecodeError:
        raise InvalidReply("the answer does not match TypeSafe's schema") from None
    if not reply.model:
        raise InvalidReply("the answer names no model")
    if reply.answers.keys() != questions.keys():
        raise InvalidReply("the answers do not cover exactly the questions asked")
    for name, question in questions.items():
        _check_answer(question, reply.answers[name])
    if reply.usage.input_tokens < 0 or reply.usage.output_tokens < 0:
        raise InvalidReply("the usage counts are negative")
    answers = {name: reply.answers[name] for name in questions}
    return SystemOneResponse(model=reply.model, answers=answers, usage=reply.usage)


def _check_answer(question: Question, answer: Answer) -> None:
    match question, answer:
        case ChoiceQuestion(), ChoiceAnswer():
            labels = question.criteria.keys()
            if answer.probabilities.keys() != labels or answer.choice not in labels:
                raise InvalidReply("a choice answer does not use the question's labels")
            _check_fractions((answer.confidence, *answer.probabilities.values()))
        case ScoreQuestion(), ScoreAnswer():
            levels = {str(i) for i in range(len(question.criteria))}
            if answer.legend.keys() != levels or answer.probabilities.keys() != levels:
                raise InvalidReply('a score answer is not keyed "0".."n-1"')
            _check_fractions((answer.confidence, *answer.probabilities.values()))
            if not -_SCORE_SLACK <= answer.score <= len(levels) - 1 + _SCORE_SLACK:
                raise InvalidReply("a score lies outside the rubric")
        case NoulQuestion(), NoulAnswer():
            _check_fractions((answer.noul,))
        case _:
            raise InvalidReply("an answer's type differs from its question's")


def _check_fractions(values: tuple[float, ...]) -> None:
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values):
        raise InvalidReply("a probability or confidence lies outside [0, 1]")
