"""The frames a gateway and its worker subprocess exchange over the worker's stdin/stdout.

Each frame is a 4-byte big-endian length followed by one msgspec msgpack message. The gateway
writes `Start`, then `Submit` per job and `Cancel` for a job whose caller has gone; the
worker answers `Ready` or `Failed` once per `Start`, `Loaded` once per checkpoint it loads,
then exactly one of `Result`, `Rejected` or `JobFailed` per submitted job id that was not
cancelled, and `PassBegun` and `PassDone` around every forward pass (the gateway's watchdog
times each pass; metrics and traces read `PassDone`). `Release` ends an engine without ending the
process: the worker drops it, returns its memory, answers `Released` and waits for the next
`Start` (a model switch, `ProcessRuntime.load`).
No frame carries an exception message: those may quote the state, and frames' errors end up
in logs.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Annotated, BinaryIO, TypeAlias

import msgspec

from decidealot.contract import ValidationIssue
from decidealot.jobs import Decision, EngineSpec, Job

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30
"""A length above this means the stream is corrupt, not that a job is large."""


class Start(msgspec.Struct, tag="start", frozen=True):
    """First frame to a worker: the engine to build and how much one pass may hold."""

    spec: EngineSpec
    batch_token_budget: int
    concurrent_passes: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Forward passes the worker runs at once, each on its own compute thread (one per core on
    CPU, so one-thread passes use every core; 1 on CUDA)."""
    job_token_limit: Annotated[int, msgspec.Meta(ge=0)] = 0
    """A job whose `input_tokens` exceed this is refused at prepare: a `Rejected` frame whose
    issue sits at the request's questions (`DECIDEALOT_MAX_REQUEST_TOKENS`); 0: no bound."""


class Submit(msgspec.Struct, tag="submit", frozen=True):
    id: int
    job: Job


class Cancel(msgspec.Struct, tag="cancel", frozen=True):
    """The job's caller has gone: withdraw its rows not yet in a pass and send no answer."""

    id: int


class Release(msgspec.Struct, tag="release", frozen=True):
    """Drop the engine (jobs not yet answered are dropped with it), return its memory, answer
    `Released` and wait for the next `Start`."""


class Ready(msgspec.Struct, tag="ready", frozen=True):
    """The engine is built and its preloaded checkpoints are in memory."""

    device: str


class Loaded(msgspec.Struct, tag="loaded", frozen=True):
    """A checkpoint is in memory (at `Start` when preloaded, else on its first job, before
    that job's answer): the precision it runs in, the `DECIDEALOT_PRECISION` value it came from
    (`requested`) and why (`reason`: requested, what `auto` chose on which CPU flags, or the
    load probe's fallback to fp32), which linear layers of its encoder run int8, and the roles
    the int8 probe kept fp32 (`kept_fp32`). `path` is the checkpoint's folder, for the
    gateway's log line and status view; nothing of its contents."""

    checkpoint: str
    path: str
    precision: str
    linear_layers: int
    int8_layers: int
    kept_fp32: list[str] = []
    requested: str = ""
    reason: str = ""
    probe_fallback: bool = False
    """True where the load probe found bf16 moved the probabilities too far: fp32 runs."""

    @property
    def int8_share(self) -> float:
        """The share (0-1) of its encoder's linear layers that run int8."""
        return self.int8_layers / self.linear_layers if self.linear_layers else 0.0


class Failed(msgspec.Struct, tag="failed", frozen=True):
    """The engine could not be built; `error` is the exception's type name only."""

    error: str


class Released(msgspec.Struct, tag="released", frozen=True):
    """The engine is gone and its memory returned; `rss_bytes` is the process's resident memory
    now (0 where it cannot be read)."""

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


class PassBegun(msgspec.Struct, tag="begin", frozen=True):
    """Compute thread `thread` starts a forward pass; its `PassDone` (or the worker's death)
    ends it. (`lane` on the wire: its name before the glossary gave lane one meaning.)"""

    thread: int = msgspec.field(name="lane")


class PassDone(msgspec.Struct, tag="pass", frozen=True):
    """A forward pass that ran on compute thread `thread`: the jobs with rows in it, its rows,
    its padded tokens, when it started (`time.time()`) and how long `engine.forward` took.
    Sent before the results of the jobs it completed."""

    thread: int = msgspec.field(name="lane")
    jobs: list[int]
    rows: int
    tokens: int
    started: float
    seconds: float


ToWorker: TypeAlias = Start | Submit | Cancel | Release
FromWorker: TypeAlias = (
    Ready | Loaded | Failed | Released | Result | Rejected | JobFailed | PassBegun | PassDone
)

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


class FrameError(Exception):
    """The stream ended inside a frame or holds something that is not a frame."""


def encode(frame: ToWorker | FromWorker) -> bytes:
    """The frame with its length prefix, ready for one write."""
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
    """Blocking read of one frame's payload; None at a clean end of stream."""
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


def write_frame(stream: BinaryIO, frame: ToWorker | FromWorker) -> None:
    """Blocking write of one frame; callers sharing `stream` across threads hold a lock."""
    stream.write(encode(frame))
    stream.flush()


async def read_payload_async(reader: asyncio.StreamReader) -> bytes | None:
    """One frame's payload from an asyncio stream; None at a clean end of stream."""
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
