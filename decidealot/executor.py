"""Runs validated requests on providers: single decisions, batches, and unload-all.

A batch runs one lane per provider: a provider's items run in input order, one at a time,
while lanes of different providers overlap (residency decides whether local ones really can).
`DECIDEALOT_MAX_BATCH_CONCURRENCY` caps provider calls made by all batches together. The first
failure stops every lane from forwarding further items; the batch then fails with the error of
the lowest failed index and returns no partial results.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from decidealot import logs, metrics, tracing
from decidealot.catalog import Catalog
from decidealot.contract import (
    BatchRequest,
    BatchResponse,
    ChoiceAnswer,
    ChoiceQuestion,
    Loc,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    UnloadedProvider,
    UnloadResponse,
    ValidationIssue,
)
from decidealot.errors import (
    DecidealotError,
    DecisionInputError,
    ProviderUnavailable,
    RequestInvalid,
)
from decidealot.residency import Residency

log = logging.getLogger("decidealot.executor")

_ANSWER_TYPES: dict[type, type] = {
    ChoiceQuestion: ChoiceAnswer,
    ScoreQuestion: ScoreAnswer,
    NoulQuestion: NoulAnswer,
}


class Executor:
    def __init__(
        self,
        catalog: Catalog,
        residency: Residency,
        local_providers: Sequence[str],
        max_batch_concurrency: int = 0,
    ) -> None:
        self._catalog = catalog
        self._residency = residency
        self._local_providers = tuple(local_providers)
        self._batch_calls: asyncio.Semaphore | None = (
            asyncio.Semaphore(max_batch_concurrency) if max_batch_concurrency > 0 else None
        )

    @tracing.traced("decision")
    async def decide(self, request: SystemOneRequest, loc: Loc | None = None) -> SystemOneResponse:
        """Answer one request; `loc` is where the request sits in the body (default `["body"]`)."""
        where = ["body"] if loc is None else loc
        route = (await self._catalog.resolve([request.model]))[request.model]
        if route is None:  # a hosted name that vanished since validation
            raise RequestInvalid(
                [
                    ValidationIssue(
                        [*where, "model"],
                        f"Value error, unknown model {request.model!r}; "
                        "use a name returned by GET /v1/models",
                        "value_error",
                        request.model,
                    )
                ]
            )
        tracing.annotate(provider=route.provider.name, model=request.model)
        outcome = "cancelled"
        started = time.perf_counter()
        try:
            response = await route.provider.decide(route.selector, request)
        except DecisionInputError as exc:
            outcome = "invalid"
            raise RequestInvalid(
                [
                    ValidationIssue(
                        [*where, "questions", exc.question, *exc.loc],
                        exc.msg,
                        "value_error",
                        exc.input,
                    )
                ]
            ) from None
        except DecidealotError:
            outcome = "unavailable"
            raise
        except Exception as exc:
            outcome = "error"
            logs.log_failure(log, exc, f"provider {route.provider.name} on {route.selector}")
            raise ProviderUnavailable() from None
        else:
            outcome = "error"
            _check_response(request, response, route.provider.name)
            outcome = "ok"
        finally:
            tokens = response.usage.input_tokens if outcome == "ok" else 0
            _record(route.provider.name, request.model, outcome, started, tokens)
        return response

    async def decide_batch(self, batch: BatchRequest) -> BatchResponse:
        routes = await self._catalog.resolve({r.model for r in batch.requests})
        lanes: dict[str, list[int]] = {}
        for index, request in enumerate(batch.requests):
            route = routes[request.model]
            lane = route.provider.name if route is not None else request.model
            lanes.setdefault(lane, []).append(index)
        results: list[SystemOneResponse | None] = [None] * len(batch.requests)
        failures: dict[int, BaseException] = {}
        stop = asyncio.Event()

        async def run_lane(indices: list[int]) -> None:
            for index in indices:
                if stop.is_set():
                    return
                try:
                    async with self._batch_slot():
                        if stop.is_set():
                            return
                        results[index] = await self.decide(
                            batch.requests[index], ["body", "requests", index]
                        )
                except Exception as exc:
                    failures[index] = exc
                    stop.set()
                    return

        await asyncio.gather(*(run_lane(indices) for indices in lanes.values()))
        if failures:
            raise failures[min(failures)]
        return BatchResponse([r for r in results if r is not None])

    def _batch_slot(self) -> contextlib.AbstractAsyncContextManager[object]:
        return self._batch_calls if self._batch_calls is not None else contextlib.nullcontext()

    async def unload(self) -> UnloadResponse:
        """Unload every local runtime, or none (ProviderBusy) while any is deciding."""
        unloaded = await self._residency.unload_all()
        was_loaded = {name: False for name in self._local_providers}
        for entry in unloaded:
            was_loaded[entry.name] = was_loaded.get(entry.name, False) or entry.was_loaded
        return UnloadResponse(
            providers=[UnloadedProvider(name, loaded) for name, loaded in was_loaded.items()]
        )


def _record(provider: str, model: str, outcome: str, started: float, tokens: int) -> None:
    metrics.DECISIONS.inc(provider=provider, model=model, outcome=outcome)
    metrics.DECISION_DURATION.observe(time.perf_counter() - started, provider=provider)
    if isinstance(tokens, int) and tokens > 0:
        metrics.INPUT_TOKENS.inc(tokens, provider=provider)


def _check_response(request: SystemOneRequest, response: object, provider: str) -> None:
    """A provider answer that does not fit the request is a provider failure (503)."""
    ok = (
        isinstance(response, SystemOneResponse)
        and isinstance(response.model, str)
        and response.answers.keys() == request.questions.keys()
        and all(
            isinstance(response.answers[name], _ANSWER_TYPES[type(question)])
            for name, question in request.questions.items()
        )
    )
    if not ok:
        log.error("provider %s returned an answer that does not fit the request", provider)
        raise ProviderUnavailable()
