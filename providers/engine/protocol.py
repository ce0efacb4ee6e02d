"""The seam's protocol: the engine a worker hosts, and the messages between the gateway's
`client` and a worker's `proc` loop and `core`.

An engine `prepare`s a job into rows; the core's planner packs rows of concurrent jobs of one
`group` into forward passes and calls `forward` once per pass; `finish` reads a job's answers
out of its rows' outputs. Rows never see each other (padding is masked), so a job's answers do
not depend on which rows shared its passes.

Messages are length-prefixed msgspec msgpack frames on the worker's stdin and stdout. The
gateway sends `Start`, `Submit` per job, `Cancel` for a job whose caller has gone and `Release`
(a model switch: drop the engine, keep the process). The worker answers a `Start` with `Ready`
or `Failed`, a `Release` with `Released`, each job not cancelled with one `Result`, `Rejected`
or `JobFailed`; it reports each checkpoint it loads (`Loaded`), each pass (`PassDone`) and, while
it holds work, what runs (`Heartbeat`), so that the client tells a slow worker from a stalled
one. No message carries an exception's text: it may quote the state.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Hashable, Sequence
from typing import Annotated, BinaryIO, NamedTuple, Protocol, TypeAlias, runtime_checkable

import msgspec

from decidealot.contract import ValidationIssue
from decidealot.jobs import CheckpointLoad, Decision, EngineSpec, Job

# -- the engine ---------------------------------------------------------------------------------


class Row(Protocol):
    """One sequence of a forward pass; the planner sorts, packs and pads rows by `tokens`."""

    @property
    def tokens(self) -> int:
        """Its unpadded length in tokens (for CLM, its vectors)."""


class PreparedJob(Protocol):
    """What the core reads of an engine's prepared job."""

    group: Hashable
    """Rows of equal group may share a forward pass (e.g. the same checkpoint)."""

    rows: Sequence[Row]
    """In the job's own order; `finish` receives one output per row."""

    input_tokens: int
    """What `usage.input_tokens` will report; `DECIDEALOT_MAX_REQUEST_TOKENS` bounds it."""


class PassShape(NamedTuple):
    """How an engine wants the rows of one forward pass cut (within the token budget)."""

    max_tokens: int | None = None
    """Padded tokens (rows x longest row) per pass; None: only the worker's token budget."""

    max_waste: int | None = None
    """Padding tokens a pass may carry before it is cut in two; None: no such rule."""


class Engine(Protocol):
    shape: PassShape

    def prepare(self, job: Job) -> PreparedJob:
        """CPU-side work for one job. Raises `RequestInvalid` (its issues located within the
        request) for input that cannot fit."""

    def forward(self, group: Hashable, rows: Sequence[Row]) -> Sequence[object]:
        """One forward pass over rows of one group, shortest first; one output per row."""

    def finish(self, prepared: PreparedJob, outputs: Sequence[object]) -> Decision:
        """The job's decision from its rows' outputs (in `prepared.rows` order)."""


@runtime_checkable
class CompilesPasses(Protocol):
    """An engine whose passes may be compiled (Laya's, Von's): the core's compile thread calls
    `compile_next` while its passes are idle, never on a request's path."""

    def compile_next(self) -> bool:
        """Compile one loaded checkpoint's pass that waits for it (reporting its load again);
        False when none waits."""


ReportLoad: TypeAlias = Callable[[CheckpointLoad], None]
"""How an engine tells its host each checkpoint it loads, as it loads it. Engine factories
are `(EngineSpec, ReportLoad) -> Engine`."""


def ignore_load(load: CheckpointLoad) -> None:
    """For engines built outside a worker (tools, tests), where nobody reads their loads."""


# -- the messages ---------------------------------------------------------------------------


class Start(msgspec.Struct, tag="start", frozen=True):
    """The engine to build (first, and after each `Released`)."""

    spec: EngineSpec
    batch_token_budget: int
    compute_threads: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Forward passes at once, each on its own compute thread (one per core on CPU, so
    one-thread passes use every core; 1 on CUDA)."""
    job_token_limit: Annotated[int, msgspec.Meta(ge=0)] = 0
    """A job whose `input_tokens` exceed this is refused at prepare: a `Rejected` frame whose
    issue sits at the request's questions (`DECIDEALOT_MAX_REQUEST_TOKENS`); 0: no bound."""
    heartbeat_seconds: Annotated[float, msgspec.Meta(gt=0)] = 1.0


class Submit(msgspec.Struct, tag="submit", frozen=True):
    id: int
    job: Job


class Cancel(msgspec.Struct, tag="cancel", frozen=True):
    """The job's caller has gone: withdraw its rows not yet in a pass and send no answer."""

    id: int


class Release(msgspec.Struct, tag="release", frozen=True):
    """Drop the engine and its unanswered jobs, return its memory, wait for the next `Start`."""


class Ready(msgspec.Struct, tag="ready", frozen=True):
    device: str


class Loaded(msgspec.Struct, tag="loaded", frozen=True):
    load: CheckpointLoad


class Failed(msgspec.Struct, tag="failed", frozen=True):
    """The engine could not be built; `error` is the exception's type name only."""

    error: str


class Released(msgspec.Struct, tag="released", frozen=True):
    """`rss_bytes`: the process's resident memory once the engine's went (0: unknown)."""

    rss_bytes: int


class Result(msgspec.Struct, tag="result", frozen=True):
    id: int
    decision: Decision


class Rejected(msgspec.Struct, tag="rejected", frozen=True):
    """The `RequestInvalid` raised for this job: its issues, located within the request."""

    id: int
    issues: list[ValidationIssue]


class JobFailed(msgspec.Struct, tag="job_failed", frozen=True):
    """Any other exception while preparing or running this job; `error` is its type name."""

    id: int
    error: str


class PassDone(msgspec.Struct, tag="pass", frozen=True):
    """A forward pass (`started`: `time.time()`; `tokens`: padded), sent before the results of
    the jobs it completed; metrics and traces read it."""

    thread: int
    jobs: list[int]
    rows: int
    tokens: int
    started: float
    seconds: float


class Heartbeat(msgspec.Struct, tag="beat", frozen=True):
    """Seconds each running pass has run (by compute thread), the running prepare or engine
    build has run, and the worker has held jobs with nothing running."""

    passes: dict[int, float] = {}
    preparing: float = 0.0
    idle: float = 0.0


ToWorker: TypeAlias = Start | Submit | Cancel | Release
FromWorker: TypeAlias = (
    Ready | Loaded | Failed | Released | Result | Rejected | JobFailed | PassDone | Heartbeat
)

# -- framing --------------------------------------------------------------------------------

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30
"""A length above this means the stream is corrupt, not that a job is large."""

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


class FrameError(Exception):
    """The stream ended inside a frame or holds something that is not a frame."""


def encode(frame: ToWorker | FromWorker) -> bytes:
    """Raises what msgpack raises for what it cannot carry (an integer beyond 64 bits)."""
    payload = _encoder.encode(frame)
    return _LENGTH.pack(len(payload)) + payload


def decode_to_worker(payload: bytes) -> ToWorker:
    try:
        return _to_worker.decode(payload)
    except msgspec.DecodeError as exc:
        raise FrameError("malformed frame") from exc


def decode_from_worker(payload: bytes) -> FromWorker:
    try:
        return _from_worker.decode(payload)
    except msgspec.DecodeError as exc:
        raise FrameError("malformed frame") from exc


def _length(prefix: bytes) -> int:
    (length,) = _LENGTH.unpack(prefix)
    if length > MAX_FRAME_BYTES:
        raise FrameError("frame length out of range")
    return length


def read_payload(stream: BinaryIO) -> bytes | None:
    """None at a clean end of stream."""
    prefix = stream.read(_LENGTH.size)
    if not prefix:
        return None
    if len(prefix) < _LENGTH.size:
        raise FrameError("stream ended inside a frame")
    length = _length(prefix)
    payload = stream.read(length)
    if len(payload) < length:
        raise FrameError("stream ended inside a frame")
    return payload


async def read_payload_async(reader: asyncio.StreamReader) -> bytes | None:
    """None at a clean end of stream."""
    try:
        prefix = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("stream ended inside a frame") from None
    try:
        return await reader.readexactly(_length(prefix))
    except asyncio.IncompleteReadError:
        raise FrameError("stream ended inside a frame") from None
