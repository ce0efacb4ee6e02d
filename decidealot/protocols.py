"""The interface between the executor and every provider (Laya, Von, CLM, Jev).

The executor knows providers only through these protocols. A hosted provider (Jev) answers a
request itself (`HostedProvider.decide`). A local provider only *prepares* a request into a
worker `Job` (routing, CLM's encoder calls); the executor runs that job on the provider's
`runtime` inside the residency slot and lane it is admitted to. Provider code never sees HTTP,
residency, the catalog or bundles; transport code never sees tensors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import NamedTuple, Protocol, runtime_checkable

from decidealot.contract import ModelInfo, SystemOneRequest, SystemOneResponse
from decidealot.jobs import Decision, Job

forwarded: ContextVar[Callable[[], None] | None] = ContextVar("forwarded", default=None)
"""Set by the executor for each batch item: a local runtime calls it once the item's job is on
its way to the worker, so the provider's next item may follow in input order without waiting
for this one's answer (and the two can share passes)."""


@runtime_checkable
class Provider(Protocol):
    """One configured provider, created at startup; no model is loaded by creating it."""

    name: str
    """`laya`, `von`, `clm` or `jev`: the name `/health` and unload reports use."""

    local: bool
    """True for a `LocalProvider`: decisions run on this host and take a residency slot."""

    accepts_temperature: bool
    """Its selectors take `config: {"temperature": t}`; all others take `{}` only."""

    async def start(self) -> None:
        """Open clients; never loads a model."""

    async def close(self) -> None:
        """Stop workers and close clients; idempotent."""

    async def models(self) -> list[ModelInfo]:
        """The selectors this provider serves now. Jev may raise `ProviderUnavailable`."""


@runtime_checkable
class HostedProvider(Provider, Protocol):
    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        """Answer one validated request for `selector` (one of `models()`' names).

        Raises `DecisionInputError` for input the model cannot take (422 naming the question)
        and `ProviderUnavailable` for anything that stops the provider from answering.
        """


@runtime_checkable
class LocalRuntime(Protocol):
    """A local provider's loadable runtime (its worker process), driven by residency."""

    name: str
    device: str
    """`cpu` or `cuda`, resolved from `DECIDEALOT_DEVICE`: residency's lane follows it."""

    @property
    def loaded(self) -> bool:
        """True while the worker is up and healthy; turns False by itself if it dies."""

    async def load(self) -> None:
        """Start the worker and wait until it reports healthy; raise ProviderUnavailable."""

    async def unload(self) -> None:
        """Stop the worker process so its memory returns to the system; idempotent."""

    async def submit(self, job: Job) -> Decision:
        """Run one job on the loaded worker; raises `DecisionInputError` (422) or
        `ProviderUnavailable` (503). Cancelling the call withdraws the job."""


class PreparedRequest(NamedTuple):
    """What a local provider made of a request: the worker's job, and model tokens the
    gateway already spent on it (CLM's encoder calls), which `usage.input_tokens` adds."""

    job: Job | None
    """None while `rest` is still to run."""
    gateway_tokens: int = 0
    rest: Callable[[], Awaitable[PreparedRequest]] | None = None
    """Work that makes the job and must keep to the provider's lane (CLM's encoder calls): run
    inside the residency hold when the provider `prepares_in_lane`."""


@runtime_checkable
class LocalProvider(Provider, Protocol):
    runtime: LocalRuntime

    prepares_in_lane: bool
    """A prepared request's `rest` runs inside the residency hold (CLM's encoder shares the
    serial lane)."""

    async def prepare(self, selector: str, request: SystemOneRequest) -> PreparedRequest:
        """The job that answers `request` sent to `selector`, or the `rest` that makes it. Runs
        before any residency wait, so whatever refuses a request (routing, bounds, the work
        bound) answers at once. Raises `DecisionInputError` or `ProviderUnavailable` as
        `HostedProvider.decide` does."""
