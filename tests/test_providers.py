"""Fake providers for the gateway's tests; never part of the shipped catalog.

Each fake answers from the request alone (uniform probabilities over the labels), so tests
can check shapes without a model. A request steers its fake through its state: a state object
`{"fake": {"sleep": s, "fail": kind}}` sleeps `s` seconds inside the provider (inside the
residency slot for local fakes), then fails with `unavailable`, `input`, `bad_answer` or
`crash`. Every call appends a JSON line (provider, selector, tag, start/end) to the file named
by DECIDEALOT_TEST_EVENTS, so tests can see order and overlap across the process boundary.
The fake Jev reads its catalog from the JSON file DECIDEALOT_TEST_JEV_CATALOG (a list of
names, or "fail").
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec

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
from decidealot.errors import DecisionInputError, ProviderUnavailable
from decidealot.residency import Residency
from providers.base import Provider

ANSWERING_MODEL = {"laya": "laya-english", "von": "von-1.1", "clm": "clm-0.1-8b"}


class FakeRuntime:
    def __init__(self, name: str) -> None:
        self.name = name
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    async def load(self) -> None:
        await asyncio.sleep(0.01)
        self._loaded = True

    async def unload(self) -> None:
        self._loaded = False


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


def _record(provider: str, selector: str, tag: Any, start: float, end: float) -> None:
    path = os.environ.get("DECIDEALOT_TEST_EVENTS")
    if path:
        line = {"provider": provider, "selector": selector, "tag": tag, "start": start, "end": end}
        with open(path, "a") as events:
            events.write(json.dumps(line) + "\n")


class FakeProvider:
    def __init__(self, name: str, residency: Residency | None) -> None:
        self.name = name
        self.local = residency is not None
        self._residency = residency
        self._runtime = FakeRuntime(name)
        if residency is not None:
            residency.register(self._runtime)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        await self._runtime.unload()

    async def models(self) -> list[ModelInfo]:
        path = os.environ.get("DECIDEALOT_TEST_JEV_CATALOG")
        names: Any = json.loads(Path(path).read_text()) if path else ["jev-latest"]
        if names == "fail":
            raise ProviderUnavailable("the hosted model catalog is unavailable")
        return [ModelInfo(n, f"Hosted {n}.", "2026-09-15") for n in names]

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        if self._residency is None:
            return await self._decide(selector, request)
        async with self._residency.use(self._runtime):
            return await self._decide(selector, request)

    async def _decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        steer = request.state.get("fake", {}) if isinstance(request.state, dict) else {}
        start = time.time()
        await asyncio.sleep(float(steer.get("sleep", 0)))
        _record(self.name, selector, steer.get("tag"), start, time.time())
        fail = steer.get("fail")
        first = next(iter(request.questions))
        if fail == "unavailable":
            raise ProviderUnavailable()
        if fail == "input":
            raise DecisionInputError(first, "Value error, too long for this model", ["criteria"], 7)
        if fail == "crash":
            raise RuntimeError(f"secret state {request.state!r}")
        answers = {name: _answer(q) for name, q in request.questions.items()}
        if fail == "bad_answer":
            answers.pop(first)
        model = ANSWERING_MODEL.get(self.name, selector)
        usage = Usage(input_tokens=10 * len(request.questions))
        return SystemOneResponse(model, answers, usage)


def build(settings: Settings, residency: Residency) -> list[Provider]:
    """One fake per configured provider, as `Service` would build the real ones."""
    fakes: list[Provider] = []
    for name in settings.providers:
        fakes.append(FakeProvider(name, None if name == "jev" else residency))
    return fakes


def test_fakes_follow_the_provider_protocol() -> None:
    settings = Settings(typesafe_api_key="k")
    fakes = build(settings, Residency(settings))
    assert [f.name for f in fakes] == ["laya", "von", "jev"]
    assert all(isinstance(f, Provider) for f in fakes)
    assert msgspec.json.encode(_answer(ChoiceQuestion({"a": None, "b": "x"})))
