"""Fake providers for the gateway's tests; never part of the shipped catalog.

Each fake answers from the request alone (uniform probabilities over the labels), so tests
can check shapes without a model. Local fakes are `LocalProvider`s whose runtime answers the
job itself; the fake Jev is a `HostedProvider`. A request steers its fake through its state: a
state object `{"fake": {"sleep": s, "fail": kind}}` sleeps `s` seconds while answering (inside
the residency slot and lane for local fakes), then fails with `unavailable`, `input`,
`bad_answer` or `crash`. Every call appends a JSON line (provider, selector, tag, start/end) to
the file named by DECIDEALOT_TEST_EVENTS, so tests can see order and overlap across the
process boundary, and one (provider, selector, tag, begun) as it starts, so a test can wait
for a request to hold its slot instead of sleeping.
The fake Jev reads its catalog from the JSON file DECIDEALOT_TEST_JEV_CATALOG (a list of
names, or "fail").
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from decidealot import registry
from decidealot.config import Settings
from decidealot.contract import (
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    ModelInfo,
    NoulAnswer,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    Usage,
)
from decidealot.errors import ProviderUnavailable, RequestInvalid
from decidealot.jobs import CheckpointLoad, Decision, Job
from decidealot.protocols import Provider

ANSWERING_MODEL = {"laya": "laya-english", "von": "von-1.1", "clm": "clm-0.1-8b"}


class FakeRuntime:
    device = "cpu"

    def __init__(self, name: str) -> None:
        self.name = name
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    async def load(self, replacing: object = None) -> None:
        if replacing is not None:
            await replacing.unload()  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)
        self._loaded = True

    async def unload(self) -> None:
        self._loaded = False

    def checkpoints(self) -> list[CheckpointLoad]:
        return []

    async def submit(self, job: Job, sent: Callable[[], None] | None = None) -> Decision:
        """Answers the job itself: nothing is forwarded anywhere, so `sent` is never called and
        a batch's next item for this provider waits for this one's answer."""
        response = await _decide(self.name, job.checkpoint, job.state, job.questions)
        return Decision(response.model, response.answers, response.usage.input_tokens)


def _answer(question: Any) -> Answer:
    if isinstance(question, ChoiceQuestion):
        labels = list(question.criteria)
        p = 1 / len(labels)
        return ChoiceAnswer(labels[0], 0.0, {label: p for label in labels})
    if isinstance(question, ScoreQuestion):
        n = len(question.criteria)
        keys = [str(i) for i in range(n)]
        legend = dict(zip(keys, question.criteria, strict=True))
        return ScoreAnswer((n - 1) / 2, 0.0, legend, {k: 1 / n for k in keys})
    return NoulAnswer(0.5)


def _record(provider: str, selector: str, tag: Any, **times: float) -> None:
    path = os.environ.get("DECIDEALOT_TEST_EVENTS")
    if path:
        line = {"provider": provider, "selector": selector, "tag": tag, **times}
        with open(path, "a") as events:
            events.write(json.dumps(line) + "\n")


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_events(path: Path) -> list[dict[str, Any]]:
    """The calls the fakes finished so far (provider, selector, tag, start, end), in order."""
    return [line for line in _read(path) if "end" in line]


def read_begun(path: Path) -> list[Any]:
    """The tags of the calls the fakes began so far (finished ones included), in order."""
    return [line["tag"] for line in _read(path) if "begun" in line]


async def _decide(
    provider: str, selector: str, state: Any, questions: dict[str, Any]
) -> SystemOneResponse:
    steer = state.get("fake", {}) if isinstance(state, dict) else {}
    start = time.time()
    _record(provider, selector, steer.get("tag"), begun=start)
    await asyncio.sleep(float(steer.get("sleep", 0)))
    _record(provider, selector, steer.get("tag"), start=start, end=time.time())
    fail = steer.get("fail")
    first = next(iter(questions))
    if fail == "unavailable":
        raise ProviderUnavailable()
    if fail == "input":
        raise RequestInvalid.question(
            first, "Value error, too long for this model", ["criteria"], 7
        )
    if fail == "crash":
        raise RuntimeError(f"secret state {state!r}")
    answers = {name: _answer(q) for name, q in questions.items()}
    if fail == "bad_answer":
        answers.pop(first)
    model = ANSWERING_MODEL.get(provider, selector)
    return SystemOneResponse(model, answers, Usage(input_tokens=10 * len(questions)))


class FakeProvider:
    def __init__(self, name: str, local: bool) -> None:
        self.name = name
        self.local = local
        self.accepts_temperature = name == "clm"
        self.runtime = FakeRuntime(name)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        await self.runtime.unload()

    async def models(self) -> list[ModelInfo]:
        if self.local:
            return list(registry.descriptor(self.name).selectors)
        path = os.environ.get("DECIDEALOT_TEST_JEV_CATALOG")
        names: Any = json.loads(Path(path).read_text()) if path else ["jev-latest"]
        if names == "fail":
            raise ProviderUnavailable("the hosted model catalog is unavailable")
        return [ModelInfo(n, f"Hosted {n}.", "2026-09-15") for n in names]

    async def accept(self, selector: str, request: SystemOneRequest) -> Job:
        return Job(selector, request.state, request.questions, request.config)

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        return await _decide(self.name, selector, request.state, request.questions)


def build(settings: Settings) -> list[Provider]:
    """One fake per configured provider, as `Service` would build the real ones."""
    return [FakeProvider(d.name, local=d.local) for d in registry.enabled(settings)]
