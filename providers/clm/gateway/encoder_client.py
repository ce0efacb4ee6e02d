"""The client for CLM's OpenAI-compatible embeddings endpoint (gateway side, no torch).

Only the operator's URL is contacted. Every failure is `ProviderUnavailable` with its fixed
message; the log line says why, never with a text. Only option texts' vectors are cached.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Annotated

import cachetools
import httpx
import msgspec
from tenacity import AsyncRetrying, retry_if_exception, stop_before_delay, wait_exponential

from decidealot import metrics, tracing
from decidealot.errors import ProviderUnavailable

logger = logging.getLogger(__name__)

MAX_INPUTS_PER_CALL = 32  # upstream's chunk size, and TEI's default client batch limit


def embeddings_endpoint(url: str) -> str:
    """`…/embeddings` is used as given; `…/v1` gets `/embeddings`; else `/v1/embeddings`."""
    base = url.rstrip("/")
    if base.endswith("/embeddings"):
        return base
    if base.endswith("/v1"):
        return f"{base}/embeddings"
    return f"{base}/v1/embeddings"


class _Embedding(msgspec.Struct):
    index: int
    embedding: bytes | list[float]  # base64 in JSON: msgspec decodes it, strictly


class _Usage(msgspec.Struct):
    prompt_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None


class _EmbeddingsResponse(msgspec.Struct):
    data: list[_Embedding]
    usage: _Usage | None = None


class _EncoderFailure(Exception):
    """Why a call failed, in words safe to log; `kind`: the metric reason; `transient`: retried."""

    def __init__(self, reason: str, kind: str = "invalid_reply", *, transient: bool = False):
        super().__init__(reason)
        self.kind = kind
        self.transient = transient


class Embedded(msgspec.Struct, frozen=True):
    rows: list[bytes]  # a float32 row (host byte order) per input text, in order
    prompt_tokens: int  # the encoder's usage for the calls made (0 when all were cached)


class EncoderClient:  # one shared `httpx.AsyncClient`, plus the candidate cache
    def __init__(
        self,
        url: str,
        model: str,
        *,
        width: int,
        api_key: str | None = None,
        timeout_seconds: float = 30.0,
        retry_seconds: float = 10.0,
        cache_size: int = 4096,
        cache_ttl_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        """`clock` and `sleep`: a test moves the cache past its TTL and records the backoffs."""
        self._endpoint = embeddings_endpoint(url)
        self._model = model
        self.width = width
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_seconds)
        self._retry_seconds = retry_seconds
        self._sleep = sleep
        self._cache: cachetools.TTLCache[str, bytes] | None = (
            cachetools.TTLCache(maxsize=cache_size, ttl=cache_ttl_seconds, timer=clock)
            if cache_size
            else None
        )
        self._client: httpx.AsyncClient | None = None
        self.answered_last_call: bool | None = None  # retries included; None before any call

    async def start(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(headers=self._headers, timeout=self._timeout)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def embed(self, texts: Sequence[str], *, cache: bool) -> Embedded:
        """Vectors for `texts`, each distinct text fetched once; `cache`: through the cache."""
        store: MutableMapping[str, bytes] = self._cache if cache and self._cache is not None else {}
        unique = dict.fromkeys(texts)
        found = {text: row for text in unique if (row := store.get(text)) is not None}
        missing = [text for text in unique if text not in found]
        tokens = 0
        for start in range(0, len(missing), MAX_INPUTS_PER_CALL):
            chunk = missing[start : start + MAX_INPUTS_PER_CALL]
            rows, spent = await self._fetch(chunk)
            tokens += spent
            found.update(zip(chunk, rows, strict=True))
            store.update(zip(chunk, rows, strict=True))
        return Embedded(rows=[found[text] for text in texts], prompt_tokens=tokens)

    @tracing.traced("encoder", kind="client")
    async def _fetch(self, texts: list[str]) -> tuple[list[bytes], int]:
        tracing.annotate(inputs=len(texts))
        retrying = AsyncRetrying(
            sleep=self._sleep,
            stop=stop_before_delay(self._retry_seconds),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            retry=retry_if_exception(lambda exc: getattr(exc, "transient", False)),
            reraise=True,
        )
        try:
            answer = await retrying(self._call, texts)
        except _EncoderFailure as failure:
            self.answered_last_call = False
            logger.warning("CLM encoder call failed: %s", failure)
            metrics.ENCODER_FAILURES.inc(reason=failure.kind)
            tracing.annotate(failure=failure.kind)
            raise ProviderUnavailable() from None
        self.answered_last_call = True
        return answer

    async def _call(self, texts: list[str]) -> tuple[list[bytes], int]:
        await self.start()
        assert self._client is not None
        body = {"model": self._model, "input": texts, "encoding_format": "base64"}
        headers: dict[str, str] = {}
        tracing.inject(headers)
        try:
            response = await self._client.post(self._endpoint, json=body, headers=headers)
        except httpx.TimeoutException:
            raise _EncoderFailure("timed out", "timeout", transient=True) from None
        except httpx.TransportError as exc:  # refused, reset, protocol errors
            reason = f"transport error ({type(exc).__name__})"
            raise _EncoderFailure(reason, "connection", transient=True) from None
        except httpx.RequestError as exc:  # e.g. an undecodable body: retrying will not help
            reason = f"request error ({type(exc).__name__})"
            raise _EncoderFailure(reason, "connection") from None
        status = response.status_code
        if status != 200:
            transient = status >= 500 or status == 429
            raise _EncoderFailure(f"answered status {status}", "status", transient=transient)
        try:
            parsed = msgspec.json.decode(response.content, type=_EmbeddingsResponse)
        except msgspec.DecodeError as exc:  # its message names a path and a type, no content
            raise _EncoderFailure(f"malformed response body ({exc})") from None
        if sorted(item.index for item in parsed.data) != list(range(len(texts))):
            raise _EncoderFailure("response does not index every input once")
        rows = [self._row(item.embedding) for item in sorted(parsed.data, key=lambda i: i.index)]
        tokens = parsed.usage.prompt_tokens if parsed.usage else None
        return rows, tokens or 0

    def _row(self, embedding: bytes | list[float]) -> bytes:
        if isinstance(embedding, bytes):
            if len(embedding) != self.width * 4:
                raise _EncoderFailure(f"embedding is not {self.width} float32")
            row = array("f")
            row.frombytes(embedding)
            if sys.byteorder == "big":  # the wire is little-endian
                row.byteswap()
        else:
            if len(embedding) != self.width:
                raise _EncoderFailure(f"embedding is not {self.width} floats")
            row = array("f", embedding)
        if not all(map(math.isfinite, row)):  # float32 overflow shows up here as inf
            raise _EncoderFailure("embedding has non-finite values")
        return row.tobytes()
