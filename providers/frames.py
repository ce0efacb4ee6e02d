"""The frames a gateway and its worker subprocess exchange over the worker's stdin/stdout.

Each frame is a 4-byte big-endian length followed by one msgspec msgpack message. The gateway
writes `Start` once, then `Submit` per job; the worker answers `Ready` or `Failed` once, then
exactly one of `Result`, `InputError` or `JobFailed` per submitted job id, and, when `Start`
asked for them, one `Pass` before the results of each forward pass (for the gateway's metrics).
No frame carries an exception message: those may quote the state, and frames' errors end up
in logs.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Annotated, BinaryIO, TypeAlias

import msgspec

from decidealot.contract import Json, Loc
from providers.engine import Decision, EngineSpec, Job

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30
"""A length above this means the stream is corrupt, not that a job is large."""


class Start(msgspec.Struct, tag="start", frozen=True):
    """First frame to a worker: the engine to build and how much one pass may hold."""

    spec: EngineSpec
    batch_token_budget: int
    report_passes: bool = False
    """Send a `Pass` frame per forward pass."""
    concurrent_passes: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Forward passes the worker runs at once, each on its own compute thread (one per core on
    CPU, so one-thread passes use every core; 1 on CUDA)."""


class Submit(msgspec.Struct, tag="submit", frozen=True):
    id: int
    job: Job


class Ready(msgspec.Struct, tag="ready", frozen=True):
    """The engine is built and its preloaded checkpoints are in memory."""

    device: str


class Failed(msgspec.Struct, tag="failed", frozen=True):
    """The engine could not be built; `error` is the exception's type name only."""

    error: str


class Result(msgspec.Struct, tag="result", frozen=True):
    id: int
    decision: Decision


class InputError(msgspec.Struct, tag="input_error", frozen=True):
    """A `DecisionInputError` raised for this job, rebuilt as one in the gateway."""

    id: int
    question: str
    msg: str
    loc: Loc = []
    input: Json = None


class JobFailed(msgspec.Struct, tag="job_failed", frozen=True):
    """Any other exception while preparing or running this job; `error` is its type name."""

    id: int
    error: str


class Pass(msgspec.Struct, tag="pass", frozen=True):
    """One forward pass that answered: how many jobs it held, their summed token cost, and how
    long `engine.run` took. Sent before that pass's results."""

    size: int
    tokens: int
    seconds: float
    ids: list[int] = []
    """The job ids it answered, so the gateway can trace the pass under each job's request."""
    started: float = 0.0
    """When `engine.run` began, in `time.time()` seconds (same host, same clock)."""


ToWorker: TypeAlias = Start | Submit
FromWorker: TypeAlias = Ready | Failed | Result | InputError | JobFailed | Pass

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
