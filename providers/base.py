"""The interface between the executor and every provider (Laya, Von, CLM, Jev).

The executor knows providers only through `Provider`. Local providers also implement
`LocalRuntime`, through which `decidealot.residency` loads and unloads their worker
processes; provider code never sees HTTP and transport code never sees tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

from decidealot.contract import ModelInfo, SystemOneRequest, SystemOneResponse
from providers.engine import Decision, Job

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
    """True when decisions run on this host and take a residency slot."""

    async def start(self) -> None:
        """Open clients; never loads a model."""

    async def close(self) -> None:
        """Stop workers and close clients; idempotent."""

    async def models(self) -> list[ModelInfo]:
        """The selectors this provider serves now. Jev may raise `ProviderUnavailable`."""

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        """Answer one validated request for `selector` (one of `models()`' names).

        Raises `DecisionInputError` for input the model cannot take (422 naming the question)
        and `ProviderUnavailable` for anything that stops the provider from answering.
        """


@runtime_checkable
class LocalRuntime(Protocol):
    """A local provider's loadable runtime (its worker process), driven by residency."""

    name: str

    @property
    def loaded(self) -> bool:
        """True while the worker is up and healthy; turns False by itself if it dies."""

    async def load(self) -> None:
        """Start the worker and wait until it reports healthy; raise ProviderUnavailable."""

    async def unload(self) -> None:
        """Stop the worker process so its memory returns to the system; idempotent."""


@runtime_checkable
class JobRunner(Protocol):
    """Runs an engine job on a local provider's worker, inside its residency slot and lane."""

    async def run(self, job: Job) -> Decision:
        """Raises `DecisionInputError` (422) or `ProviderUnavailable` (503)."""
