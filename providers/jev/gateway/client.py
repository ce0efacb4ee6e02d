"""The one HTTP client to TypeSafe: the operator's fixed URL and key, timeouts, bounded retries.

Nothing in a request can reach this module's URL or key. No retry's delay starts that would end
past the retry budget. Every failure is `ProviderUnavailable` with the fixed safe message; its
log line never names the key or a body (upstream bodies can echo the caller's state).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from typing import NoReturn, TypeVar

import httpx
import zstandard
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from decidealot import __version__, metrics, tracing
from decidealot.errors import ProviderUnavailable

T = TypeVar("T")

log = logging.getLogger(__name__)

# The SDK's own choices, so TypeSafe sees the traffic shape it designed for.
_BACKOFF_INITIAL_SECONDS = 0.5
_BACKOFF_MAX_SECONDS = 5.0
_BACKOFF_JITTER = 0.25
_MIN_COMPRESSED_BYTES = 1024
_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=100, keepalive_expiry=30.0)
_REQUEST_ID_HEADER = "x-typesafe-request-id"


class InvalidReply(Exception):
    """A 2xx body the contract forbids (the caller's `decode` raises it); quotes no content."""


class _Status(Exception):
    """A non-2xx answer. Transient ones (408, 429, 5xx) are retried, after TypeSafe's requested
    wait if it names one. The rest are final: 401/403 mean the operator's key was rejected,
    400/422 that TypeSafe refused what our validator accepted, which its detail would only
    explain in upstream terms. None is the caller's to see: all become the safe 503."""

    def __init__(self, response: httpx.Response):
        super().__init__(response.status_code)
        self.status = response.status_code
        self.transient = self.status in (408, 429) or self.status >= 500
        self.retry_after = retry_after_seconds(response.headers) if self.transient else None
        self.request_id = response.headers.get(_REQUEST_ID_HEADER)


class TypeSafeClient:  # one pooled `httpx.AsyncClient`
    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        timeout_seconds: float,
        retry_seconds: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`sleep` and `clock`: a test records the backoffs and spends the budget on its clock."""
        self._base_url = base_url.rstrip("/")
        # httpx.Headers hides `authorization` in its repr, so the key never prints from here.
        self._headers = httpx.Headers(
            {
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": f"decidealot/{__version__}",
            }
        )
        self._timeout = httpx.Timeout(timeout_seconds)
        self._retry_seconds = retry_seconds
        self._sleep = sleep
        self._clock = clock
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self._base_url,
                headers=self._headers,
                timeout=self._timeout,
                limits=_LIMITS,
                follow_redirects=False,
            )

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    @tracing.traced("typesafe", kind="client")
    async def call(
        self, method: str, path: str, decode: Callable[[bytes], T], body: bytes | None = None
    ) -> T:
        """One logical call: retried while transient, then decoded once (a bad 2xx is final)."""
        tracing.annotate({"http.request.method": method, "url.path": path})
        http = self._http
        if http is None:
            _fail(method, path, "not_started", "the client is not started", None)
        headers: dict[str, str] = {}
        if body is not None:
            headers["Content-Type"] = "application/json"
            if len(body) >= _MIN_COMPRESSED_BYTES:  # compressed like the SDK's
                headers["Content-Encoding"] = "zstd"
                body = zstandard.ZstdCompressor().compress(body)
        tracing.inject(headers)
        started = self._clock()

        def out_of_budget(state: RetryCallState) -> bool:  # stop_before_delay, on `clock`
            return self._clock() - started + state.upcoming_sleep >= self._retry_seconds

        retrying = AsyncRetrying(
            sleep=self._sleep,
            stop=out_of_budget,
            wait=_wait,
            retry=retry_if_exception(_transient),
            before_sleep=lambda state: _log_retry(method, path, state),
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    if attempts > 1:
                        headers["X-TypeSafe-Retry-Count"] = str(attempts - 1)
                    response = await http.request(method, path, content=body, headers=headers)
                    if not response.is_success:
                        raise _Status(response)
        except (_Status, httpx.HTTPError) as error:
            _fail(method, path, *_failure(error, attempts), getattr(error, "request_id", None))
        try:  # the loop either produced a success or raised
            return decode(response.content)
        except InvalidReply as error:
            request_id = response.headers.get(_REQUEST_ID_HEADER)
            _fail(method, path, "invalid_reply", f"invalid reply: {error}", request_id)


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    """TypeSafe's requested wait: `retry-after-ms` first, then `Retry-After` (seconds or date)."""
    for name, per_second in (("retry-after-ms", 1000), ("retry-after", 1)):
        try:
            value = float(headers.get(name, "").strip())
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value / per_second
    try:
        date = parsedate_to_datetime(headers.get("retry-after", ""))
        return max(0.0, date.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _transient(error: BaseException) -> bool:
    return isinstance(error, httpx.TransportError) or getattr(error, "transient", False)


def _wait(state: RetryCallState) -> float:
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, _Status) and error.retry_after is not None:
        return error.retry_after
    exponential = _BACKOFF_INITIAL_SECONDS * 2 ** (state.attempt_number - 1)
    return min(_BACKOFF_MAX_SECONDS, exponential) * (1 - random.random() * _BACKOFF_JITTER)


def _failure(error: Exception, attempts: int) -> tuple[str, str]:
    """The failure's metric reason and what went wrong, in words with no URL, key or body."""
    tries = f"after {attempts} attempt(s)"
    if isinstance(error, _Status):
        if error.status in (401, 403):
            return "key_rejected", f"the configured key was rejected (status {error.status})"
        if error.transient:
            return "unavailable", f"status {error.status} {tries}"
        return "refused", f"refused with status {error.status}"
    if isinstance(error, httpx.TimeoutException):
        return "timeout", f"timed out {tries}"
    return "connection", f"{type(error).__name__} {tries}"


def _log_retry(method: str, path: str, state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    what = f"status {error.status}" if isinstance(error, _Status) else type(error).__name__
    attempt, delay = state.attempt_number, state.upcoming_sleep
    log.info("TypeSafe %s %s: %s, retry %d in %.2f s", method, path, what, attempt, delay)


def _fail(method: str, path: str, kind: str, reason: str, request_id: str | None) -> NoReturn:
    metrics.UPSTREAM_FAILURES.inc(provider="jev", route=path, reason=kind)
    tracing.annotate(failure=kind)
    request_id = request_id or "-"
    log.warning("TypeSafe %s %s failed: %s (request id %s)", method, path, reason, request_id)
    raise ProviderUnavailable() from None
