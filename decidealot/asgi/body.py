"""What arrives through a request's `receive`: its body, and the client's hanging up.

A body is held to the size limit on the wire and again decoded, in bounded pieces, and a zstd
frame's window to the limit too: no upload or zip bomb is ever held in memory whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import zlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import zstandard
from litestar.types import Message, Receive

from decidealot.config import Settings
from decidealot.errors import (
    MalformedBody,
    RequestTimeout,
    RequestTooLarge,
    UnsupportedEncoding,
    UnsupportedMediaType,
)

T = TypeVar("T")

CLIENT_GONE = 499  # the access log's status for a request whose client went away (as nginx's)

_PIECE = 64 * 1024
_ZSTD_MIN_WINDOW = 1 << 10  # ZSTD_WINDOWLOG_ABSOLUTEMIN
_ZSTD_WINDOW_TOO_LARGE = "Frame requires too much memory"  # the one ZstdError not corruption

Headers = dict[bytes, bytes]

_DISCARD_LIMITS = 8  # body limits `Incoming.discard` drops at most; then the connection closes


class Incoming:
    def __init__(self, receive: Receive, headers: Headers) -> None:
        self._receive = receive
        length = headers.get(b"content-length", b"").strip()
        announced = b"transfer-encoding" in headers or (length.isdigit() and int(length) > 0)
        self.complete = not announced

    async def __call__(self) -> Message:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.complete = True
        return message

    async def discard(self, largest_body: int, settings: Settings) -> None:
        """After an early answer, read and drop what is left of the body (bounded), so the server
        does not close the connection on unread bytes: the reset that would follow can destroy
        the answer before a client that is still writing reads it."""
        left = _DISCARD_LIMITS * largest_body
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settings.request_read_timeout_seconds):
                while not self.complete and left > 0:
                    left -= len((await self()).get("body", b""))


def check_media_type(headers: Headers) -> bool:
    """JSON only; True when the body must still show it is JSON. A missing Content-Type is read
    as JSON (FastAPI's leniency), and a form body as JSON when it is an object or array, as many
    JSON APIs do for `curl -d`, which sends the form type; a real form body is refused once read."""
    raw = headers.get(b"content-type")
    if raw is None:
        return False
    media_type = raw.split(b";", 1)[0].strip().lower()
    if media_type == b"application/json" or (
        media_type.startswith(b"application/") and media_type.endswith(b"+json")
    ):
        return False
    if media_type == b"application/x-www-form-urlencoded":
        return True
    if media_type == b"multipart/form-data":
        raise UnsupportedMediaType(
            "multipart/form-data bodies (image assets) are not supported by these models; "
            "send application/json"
        )
    raise UnsupportedMediaType()


def _decoder(headers: Headers) -> Callable[[bytes, int], bytes] | None:
    encoding = headers.get(b"content-encoding", b"").strip().lower()
    if encoding in (b"", b"identity"):
        return None
    if encoding in (b"gzip", b"x-gzip"):
        return _gunzip
    if encoding == b"zstd":
        return _unzstd
    raise UnsupportedEncoding()


async def read_body(receive: Receive, headers: Headers, settings: Settings) -> bytes:
    form = check_media_type(headers)
    decode = _decoder(headers)
    limit = settings.max_request_bytes
    length = headers.get(b"content-length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise RequestTooLarge()
    try:
        async with asyncio.timeout(settings.request_read_timeout_seconds):
            raw = await _receive_all(receive, limit)
    except TimeoutError:
        raise RequestTimeout() from None
    if decode is not None:
        raw = decode(raw, limit)
    if form and raw.lstrip(b" \t\r\n")[:1] not in (b"{", b"["):
        raise UnsupportedMediaType(
            "an application/x-www-form-urlencoded body is read only when it holds JSON; "
            "send the JSON request with Content-Type: application/json"
        )
    return raw


async def _receive_all(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise MalformedBody("the client disconnected before sending the whole body")
        chunks.append(message.get("body", b""))
        total += len(chunks[-1])
        if total > limit:
            raise RequestTooLarge()
        if not message.get("more_body", False):
            return b"".join(chunks)


def _gunzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while data:
        decoder = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        try:
            while data:
                out += decoder.decompress(data, limit + 1 - len(out))
                if len(out) > limit:
                    raise RequestTooLarge("the decoded request body exceeds the size limit")
                data = decoder.unconsumed_tail
        except zlib.error:
            raise MalformedBody("the gzip body is corrupt") from None
        if not decoder.eof:
            raise MalformedBody("the gzip body is truncated")
        data = decoder.unused_data  # another gzip member follows
    return bytes(out)


def zstd_window_limit(limit: int) -> int:
    """The largest window a zstd frame may declare: the body limit rounded up to a power of two.
    A frame of known size (one-shot, as the TypeSafe SDK sends) declares at most that size, so
    every body within the limit fits; a streamed frame's window follows its level and may not."""
    return max(_ZSTD_MIN_WINDOW, 1 << (limit - 1).bit_length())


def _unzstd(data: bytes, limit: int) -> bytes:
    out = bytearray()
    window = zstd_window_limit(limit)
    decompressor = zstandard.ZstdDecompressor(max_window_size=window)
    reader = decompressor.stream_reader(io.BytesIO(data), read_across_frames=True)
    try:
        while piece := reader.read(_PIECE):
            out += piece
            if len(out) > limit:
                raise RequestTooLarge("the decoded request body exceeds the size limit")
    except zstandard.ZstdError as exc:
        if _ZSTD_WINDOW_TOO_LARGE in str(exc):
            raise _window_refusal(data, window) from None
        raise MalformedBody("the zstd body is corrupt") from None
    return bytes(out)


def _window_refusal(data: bytes, window: int) -> RequestTooLarge:
    """A frame of known size declares that size as its window: then the body itself is too
    large. Otherwise the compressor chose a window the limit does not allow, perhaps one past
    zstd's own maximum, whose header zstd then refuses to read at all."""
    try:
        declared = zstandard.get_frame_parameters(data).content_size  # the first frame's
    except zstandard.ZstdError:  # a window beyond ZSTD_WINDOWLOG_MAX: nothing more to read
        declared = zstandard.CONTENTSIZE_UNKNOWN
    if declared != zstandard.CONTENTSIZE_UNKNOWN and declared > window:
        return RequestTooLarge("the decoded request body exceeds the size limit")
    return RequestTooLarge(
        f"the zstd frame declares a window over {window} bytes, more than the size limit "
        "allows: compress the body in one piece or at a lower level"
    )


class ClientGone(Exception):
    """The client disconnected before its answer was ready: the route answers 499."""


async def unless_gone(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result, or `ClientGone` (with `work` cancelled) once the client disconnects."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not job.done():
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            if watcher.done():
                raise ClientGone
        watcher.cancel()
    return job.result()
