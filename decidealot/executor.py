"""Runs validated requests on providers: admission, single decisions, batches, unload-all.

Admission: `DECIDEALOT_MAX_PENDING_REQUESTS` bounds the decision requests admitted to local
providers and not yet answered (waiting for a slot, the lane or a pass, or running); one over
it is answered at once with 503 and `Retry-After` (`Ledger.pending_request`). A batch is
admitted as one request. Hosted Jev does not count.

A batch runs one lane per provider: a provider's items go to it in input order, each as soon as
the one before it has been forwarded to its worker (not answered), so they can share passes;
lanes of different providers overlap, except that local providers take the turns residency
gives them (`Residency.batch_turns`): the resident ones first, and never more at once than
there are slots, so a batch loads each local provider it names at most once (with one slot and
Laya resident, [laya, von, laya] runs both Laya items, then switches to Von once).
`DECIDEALOT_MAX_BATCH_CONCURRENCY` caps provider calls made by all batches together. The first
failure stops every lane from forwarding further items; the batch then fails with the error of
the lowest failed index and returns no partial results.

A cancelled request (its HTTP client hung up, its MCP request was cancelled) ends its waits for
admission, a slot or the lane, and withdraws its job from the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import msgspec

from decidealot import logs, metrics, tracing
from decidealot.catalog import Routed
from decidealot.contract import (
    BatchResponse,
    ChoiceAnswer,
    ChoiceQuestion,
    Cut,
    Loc,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    UnloadedProvider,
    UnloadResponse,
    Usage,
    answer_confidence,
)
from decidealot.errors import DecidealotError, ProviderUnavailable, RequestInvalid
from decidealot.jobs import Decision, Job
from decidealot.protocols import HostedProvider, LocalProvider, LocalRuntime
from decidealot.residency import Residency

log = logging.getLogger("decidealot.executor")
Body = TypeVar("Body", SystemOneResponse, BatchResponse)

_ANSWER_TYPES: dict[type, type] = {
    ChoiceQuestion: ChoiceAnswer,
    ScoreQuestion: ScoreAnswer,
    NoulQuestion: NoulAnswer,
}


@dataclass(frozen=True, slots=True)
class Answered(Generic[Body]):
    """A response body, and the questions whose state a model read only in part: they travel
    beside the body (the `Decidealot-Truncated` header, MCP `_meta`), never in it."""

    body: Body
    cuts: list[Cut]


class Executor:
    def __init__(
        self,
        residency: Residency,
        local_providers: Sequence[str],
        max_batch_concurrency: int = 0,
    ) -> None:
        self._residency = residency
        self._local_providers = tuple(local_providers)
        self._batch_calls: asyncio.Semaphore | None = (
            asyncio.Semaphore(max_batch_concurrency) if max_batch_concurrency > 0 else None
        )

    def _admitted(self, local: bool) -> contextlib.AbstractContextManager[None]:
        """A local request's place under `DECIDEALOT_MAX_PENDING_REQUESTS` while it runs."""
        return self._residency.ledger.pending_request() if local else contextlib.nullcontext()

    async def decide(self, routed: Routed) -> Answered[SystemOneResponse]:
        with self._admitted(routed.route.provider.local):
            return await self._decide(routed, ["body"])

    @tracing.traced("decision")
    async def _decide(
        self, routed: Routed, where: Loc, sent: Callable[[], None] | None = None
    ) -> Answered[SystemOneResponse]:
        """`where` is its place in the body; `sent` is called once a local job is on its way."""
        request, route = routed
        provider = route.provider
        tracing.annotate(provider=provider.name, model=request.model)
        outcome = "cancelled"
        started = time.perf_counter()
        cuts: list[Cut] = []
        checkpoint = ""
        try:
            if provider.local:
                local = cast(LocalProvider, provider)
                response, cuts, checkpoint = await self._run_local(
                    local, route.selector, request, sent
                )
            else:
                response = await cast(HostedProvider, provider).decide(route.selector, request)
        except RequestInvalid as exc:
            outcome = "invalid"
            raise exc.within(where) from None
        except DecidealotError:
            outcome = "unavailable"
            raise
        except asyncio.CancelledError:
            if provider.local:
                metrics.REQUESTS_CANCELLED.inc(provider=provider.name)
            raise
        except Exception as exc:
            outcome = "error"
            logs.log_failure(log, exc, f"provider {provider.name} on {route.selector}")
            raise ProviderUnavailable() from None
        else:
            outcome = "error"
            _check_response(request, response, provider.name)
            outcome = "ok"
            _record_answers(provider.name, request.model, response)
            if cuts:
                _record_cuts(
                    provider.name, checkpoint, response.model, len(request.questions), cuts
                )
        finally:
            tokens = response.usage.input_tokens if outcome == "ok" else 0
            _record(provider.name, request.model, outcome, started, tokens)
        return Answered(response, cuts)

    async def decide_batch(self, batch: Sequence[Routed]) -> Answered[BatchResponse]:
        lanes: dict[str, list[int]] = {}
        runtimes: dict[str, LocalRuntime] = {}
        for index, routed in enumerate(batch):
            provider = routed.route.provider
            lanes.setdefault(provider.name, []).append(index)
            if provider.local:
                runtimes[provider.name] = cast(LocalProvider, provider).runtime
        local = bool(runtimes)
        results: list[Answered[SystemOneResponse] | None] = [None] * len(batch)
        failures: dict[int, BaseException] = {}
        stop = asyncio.Event()
        items: list[asyncio.Task[None]] = []

        async def run_item(index: int, sent: Callable[[], None]) -> None:
            try:
                async with self._batch_slot():
                    if stop.is_set():
                        return
                    where: Loc = ["body", "requests", index]
                    results[index] = await self._decide(batch[index], where, sent)
            except Exception as exc:
                failures[index] = exc
                stop.set()

        async def run_lane(indices: list[int]) -> None:
            """Start each item once the one before it is forwarded (or done)."""
            for index in indices:
                if stop.is_set():
                    return
                sent = asyncio.Event()
                item = asyncio.create_task(run_item(index, sent.set))
                items.append(item)
                waiting = asyncio.create_task(sent.wait())
                try:
                    await asyncio.wait({item, waiting}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiting.cancel()

        async def run_turns() -> None:
            """The local lanes, a turn at a time; a turn ends once its lanes have forwarded
            every item (all are admitted then), so the next turn's loads wait only for them."""
            for turn in self._residency.batch_turns(list(runtimes.values())):
                await asyncio.gather(*(run_lane(lanes[runtime.name]) for runtime in turn))

        hosted = [indices for name, indices in lanes.items() if name not in runtimes]
        with self._admitted(local):
            try:
                await asyncio.gather(run_turns(), *(run_lane(indices) for indices in hosted))
                while pending := [item for item in items if not item.done()]:
                    await asyncio.wait(pending)
            finally:
                for item in items:
                    item.cancel()  # a cancelled batch withdraws every item still running
        if failures:
            raise failures[min(failures)]
        cuts = [
            msgspec.structs.replace(cut, item=index)
            for index, each in enumerate(results)
            if each is not None
            for cut in each.cuts
        ]
        return Answered(BatchResponse([r.body for r in results if r is not None]), cuts)

    async def _run_local(
        self,
        provider: LocalProvider,
        selector: str,
        request: SystemOneRequest,
        sent: Callable[[], None] | None,
    ) -> tuple[SystemOneResponse, list[Cut], str]:
        """Accepted before any wait, so refusals are immediate; a job with calls to make is
        made before the hold or, when it asks, inside it (on the lane). Also returns the cuts,
        and the checkpoint that answered (the worker's key, as `/v1/status` names it)."""
        accepted = await provider.accept(selector, request)
        if isinstance(accepted, Job):
            async with self._residency.use(provider.runtime):
                decision = await provider.runtime.submit(accepted, sent)
            return respond(decision), decision.cuts, accepted.checkpoint
        made = None if accepted.in_lane else await accepted.make()
        async with self._residency.use(provider.runtime):
            if made is None:
                made = await accepted.make()
            decision = await provider.runtime.submit(made.job, sent)
        return respond(decision, made.gateway_tokens), decision.cuts, made.job.checkpoint

    def _batch_slot(self) -> contextlib.AbstractAsyncContextManager[object]:
        return self._batch_calls if self._batch_calls is not None else contextlib.nullcontext()

    async def unload(self) -> UnloadResponse:
        unloaded = await self._residency.unload_all()
        was_loaded = {name: False for name in self._local_providers}
        for entry in unloaded:
            was_loaded[entry.name] = was_loaded.get(entry.name, False) or entry.was_loaded
        return UnloadResponse(
            providers=[UnloadedProvider(name, loaded) for name, loaded in was_loaded.items()]
        )


def respond(decision: Decision, gateway_tokens: int = 0) -> SystemOneResponse:
    """`usage` counts every model token: the worker's and the gateway's (CLM's encoder calls)."""
    tokens = decision.input_tokens + gateway_tokens
    return SystemOneResponse(decision.model, decision.answers, Usage(input_tokens=tokens))


def _record(provider: str, model: str, outcome: str, started: float, tokens: int) -> None:
    metrics.DECISIONS.inc(provider=provider, model=model, outcome=outcome)
    metrics.DECISION_DURATION.observe(time.perf_counter() - started, provider=provider)
    if isinstance(tokens, int) and tokens > 0:
        metrics.INPUT_TOKENS.inc(tokens, provider=provider)


def _record_answers(provider: str, model: str, response: SystemOneResponse) -> None:
    """Each answer's reported probability, for a dashboard to see its distribution move."""
    for answer in response.answers.values():
        kind = str(answer.__struct_config__.tag)  # "choice", "score", "noul"
        metrics.ANSWER_CONFIDENCE.observe(
            answer_confidence(answer), provider=provider, model=model, type=kind
        )


def _record_cuts(
    provider: str, checkpoint: str, model: str, questions: int, cuts: list[Cut]
) -> None:
    """Count a state cut by the checkpoint that read it (the `checkpoint` label means what
    it means on the precision metrics), and say so in the log under the answering model's
    name: the figures, never the state's text."""
    metrics.TRUNCATED_STATES.inc(provider=provider, checkpoint=checkpoint)
    figures = ", ".join(f"{cut.question!r} read {cut.read} of {cut.total}" for cut in cuts)
    log.info(
        "state cut: %s read it only in part for %d of %d questions (state tokens: %s)",
        model,
        len(cuts),
        questions,
        figures,
    )


def _check_response(request: SystemOneRequest, response: SystemOneResponse, provider: str) -> None:
    """A 503 for an answer that does not fit the request: typed decoding has made its answers
    well formed, but no decoder knows the request (one answer per question, of its kind)."""
    answers = response.answers
    fits = answers.keys() == request.questions.keys() and all(
        isinstance(answers[name], _ANSWER_TYPES[type(question)])
        for name, question in request.questions.items()
    )
    if not fits:
        log.error("provider %s returned an answer that does not fit the request", provider)
        raise ProviderUnavailable()
