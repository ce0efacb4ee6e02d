"""The executor's one check of a provider's answer: what typed decoding cannot know, that the
answers are one per question asked and each of its question's kind; anything else is a 503."""

from __future__ import annotations

import msgspec
import pytest

from decidealot import registry
from decidealot.catalog import Route, Routed
from decidealot.contract import (
    Answer,
    ChoiceAnswer,
    NoulAnswer,
    SystemOneRequest,
    SystemOneResponse,
    Usage,
)
from decidealot.errors import ProviderUnavailable
from decidealot.executor import Executor
from decidealot.residency import Residency

REQUEST = msgspec.convert(
    {
        "model": "hosted",
        "state": "s",
        "questions": {
            "urgent": {"type": "noul", "instructions": "Urgent?"},
            "team": {"type": "choice", "criteria": {"billing": None, "tech": None}},
        },
    },
    SystemOneRequest,
)
NOUL = NoulAnswer(noul=0.5)
CHOICE = ChoiceAnswer(choice="tech", confidence=0.6, probabilities={"billing": 0.4, "tech": 0.6})


class Answering:
    """A hosted provider that answers every request with the same answers."""

    name = "hosted"
    local = False
    accepts_temperature = False

    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers = answers

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        return SystemOneResponse("hosted-1", self.answers, Usage(input_tokens=1))


async def _decide(answers: dict[str, Answer]) -> SystemOneResponse:
    executor = Executor(Residency(registry.settings()), [])
    routed = Routed(REQUEST, Route(Answering(answers), "hosted"))
    return (await executor.decide(routed)).body  # type: ignore[arg-type]


async def test_an_answer_per_question_of_its_kind_is_returned() -> None:
    response = await _decide({"team": CHOICE, "urgent": NOUL})
    assert response.answers == {"team": CHOICE, "urgent": NOUL}


@pytest.mark.parametrize(
    "answers",
    [
        {"urgent": NOUL},  # one missing
        {"urgent": NOUL, "team": CHOICE, "extra": NOUL},  # one not asked
        {"urgent": CHOICE, "team": NOUL},  # kinds swapped
    ],
)
async def test_answers_that_do_not_fit_the_request_are_a_provider_failure(
    answers: dict[str, Answer],
) -> None:
    with pytest.raises(ProviderUnavailable):
        await _decide(answers)
