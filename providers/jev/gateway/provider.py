"""`JevProvider`: TypeSafe's hosted models behind `decidealot.protocols.HostedProvider`.

Its catalog is TypeSafe's, cached for the contract's minute; callers share one refresh, and a
failed refresh fails them all (nothing stale: unavailable is a 503). Requests are the body
typesafe-sdk 0.7.5 sends. Replies are checked against the questions asked, so a caller never
gets an answer our contract forbids; reasons are fixed phrases: upstream bodies can echo content.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from functools import partial

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
from decidealot.errors import ProviderUnavailable
from decidealot.providers.jev.gateway.client import InvalidReply, TypeSafeClient

log = logging.getLogger(__name__)

CATALOG_TTL_SECONDS = 60.0
SYSTEM_ONE_PATH = "/v1/systemone"
MODELS_PATH = "/v1/models"
_SCORE_SLACK = 1e-6  # expected scores are weighted sums: rounding may step past the last level


class JevProvider:  # every decision is one TypeSafe call
    name = "jev"
    local = False
    accepts_temperature = False

    def __init__(
        self, client: TypeSafeClient, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`clock` times the catalog, so tests step past its TTL without sleeping."""
        self._client = client
        self._clock = clock
        self._models: list[ModelInfo] = []
        self._fetched_at: float | None = None
        self._refresh: asyncio.Task[list[ModelInfo]] | None = None

    async def start(self) -> None:
        await self._client.start()

    async def close(self) -> None:
        refresh, self._refresh = self._refresh, None
        if refresh is not None:
            refresh.cancel()
            await asyncio.wait([refresh])
        await self._client.close()

    async def models(self) -> list[ModelInfo]:
        fetched_at = self._fetched_at
        if fetched_at is not None and self._clock() < fetched_at + CATALOG_TTL_SECONDS:
            return list(self._models)
        if self._refresh is None:
            self._refresh = asyncio.create_task(self._load())
            # A refresh whose every waiter was cancelled must not warn about its exception.
            self._refresh.add_done_callback(lambda t: t.cancelled() or t.exception())
        # Shielded: one waiter's cancellation must not cancel the refresh the others await.
        return list(await asyncio.shield(self._refresh))

    async def _load(self) -> list[ModelInfo]:
        try:
            models = await self._client.call("GET", MODELS_PATH, decode_models)
        finally:
            if self._refresh is asyncio.current_task():  # close() may have let go of it
                self._refresh = None
        self._models, self._fetched_at = models, self._clock()
        return models

    def status_details(self) -> dict[str, Json]:
        """The hosted catalog's age (`GET /v1/status`); None before the first fetch."""
        age = None if self._fetched_at is None else self._clock() - self._fetched_at
        return {"catalog_age_seconds": age}

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        # A hosted request refreshes an expired catalog too; a name TypeSafe no longer lists
        # would only be refused upstream, so it is unavailable here without the call.
        if selector not in {model.name for model in await self.models()}:
            log.warning("TypeSafe no longer lists the hosted model %r", selector)
            raise ProviderUnavailable()
        body = encode_request(selector, request)
        decode = partial(decode_answer, questions=request.questions)
        return await self._client.call("POST", SYSTEM_ONE_PATH, decode, body)


def encode_request(model: str, request: SystemOneRequest) -> bytes:
    """TypeSafe's three-field body for `model`, the exact hosted name the caller selected."""
    questions = {name: _question_body(q) for name, q in request.questions.items()}
    return msgspec.json.encode({"state": request.state, "model": model, "questions": questions})


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
