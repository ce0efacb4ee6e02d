"""The interface between the gateway's core (executor, residency, catalog) and every provider.

The core knows providers only through these protocols. A hosted provider (Jev) answers a
request itself (`HostedProvider.decide`). A local provider `accept`s a request before any
wait (everything that may refuse it: routing, bounds) into a worker `Job`, or, where making the
job calls out (CLM's encoder), into a `JobToMake`; the executor runs the job on the provider's
`runtime` inside the residency slot and lane it is admitted to. Provider code never sees HTTP,
residency, the catalog or bundles; transport code never sees tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

from decidealot.contract import Json, ModelInfo, SystemOneRequest, SystemOneResponse
from decidealot.jobs import CheckpointLoad, Decision, Job


@runtime_checkable
class Provider(Protocol):
    """One configured provider, created at startup; no model is loaded by creating it."""

    name: str
    """Its descriptor's name: what `/health` and unload reports show."""

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
        """`RequestInvalid` for input the model cannot take (its issues located within the
        request), `ProviderUnavailable` for anything else that stops it answering."""


@runtime_checkable
class LocalRuntime(Protocol):
    """A local provider's loadable runtime (its worker), driven by residency."""

    name: str
    device: str
    """`cpu` or `cuda`, resolved from `DECIDEALOT_DEVICE`: residency's lane follows it."""

    @property
    def loaded(self) -> bool:
        """True while the worker is up and healthy; turns False by itself if it dies."""

    async def load(self, replacing: LocalRuntime | None = None) -> None:
        """ProviderUnavailable where it cannot. `replacing` (evicted to make room) is unloaded
        before this model loads, whether the load succeeds or not: one slot never holds two
        models. A runtime may take over what it leaves (its worker process, emptied)."""

    async def unload(self) -> None:
        """Stop the worker so its memory returns to the system; idempotent."""

    async def submit(self, job: Job, sent: Callable[[], None] | None = None) -> Decision:
        """`sent` is called once the job is on its way (a batch then forwards its next item,
        so the two can share passes); cancelling the call withdraws the job."""

    def checkpoints(self) -> list[CheckpointLoad]:
        """How its worker loaded each checkpoint it holds, in load order (`/v1/status`)."""


@runtime_checkable
class ReportsDetails(Protocol):
    """A provider with state of its own worth showing an operator (`GET /v1/status`)."""

    def status_details(self) -> dict[str, Json]:
        """Named JSON values, e.g. CLM's `encoder_answered_last_call`."""


class MadeJob(NamedTuple):
    """A job made in the gateway, and the model tokens spent making it (CLM's encoder calls),
    which `usage.input_tokens` adds to the worker's."""

    job: Job
    gateway_tokens: int


class JobToMake(Protocol):
    """An accepted request whose job takes calls out to make (CLM's encoder calls)."""

    in_lane: bool
    """`make` runs inside the residency hold, on the lane (CLM's encoder shares the serial
    lane); otherwise before the hold."""

    async def make(self) -> MadeJob: ...


@runtime_checkable
class LocalProvider(Provider, Protocol):
    runtime: LocalRuntime

    async def accept(self, selector: str, request: SystemOneRequest) -> Job | JobToMake:
        """Everything that may refuse `request` sent to `selector`, before any residency
        wait, so refusals (routing, bounds, the work bound) answer at once: the `Job` ready
        to run, or what makes it. Raises `RequestInvalid` or `ProviderUnavailable` as
        `HostedProvider.decide` does."""
