"""Where `decidealot evaluate` gets its answers: a service of its own in this process (the one
`serve` would run, its local workers included, without HTTP) or a running Decidealot at `--url`.
Both take rows a batch at a time through the batch path (`POST /v1/systemone/batch` and the
executor behind it), and both say afterwards what answered (`/v1/status`'s checkpoints).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import httpx
import msgspec

from decidealot import registry
from decidealot.config import Settings
from decidealot.contract import (
    TRUNCATED_HEADER,
    BatchResponse,
    Cut,
    ErrorBody,
    Json,
    ModelList,
    Status,
    SystemOneResponse,
    ValidationErrorBody,
    ValidationIssue,
    read_truncated_header,
)
from decidealot.errors import DecidealotError, RequestInvalid

Batch = tuple[list[SystemOneResponse], list[Cut]]
"""A batch's answers, and the questions whose state a model read only in part (`Cut.item`: the
request's place in the batch)."""


class Refused(Exception):
    """The service refused an item of a batch: `index` is its place, `message` says why."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


class Unanswered(Exception):
    """The service could not answer (unavailable, unreachable, not a Decidealot)."""


class NotServed(Exception):
    """The service serves no model of the selector's name; the message lists those it does."""


class KeyRefused(Exception):
    """The server at `--url` refused the key (or its absence)."""


class Answerer(Protocol):
    async def check(self, selector: str) -> None:
        """`NotServed` unless the service serves `selector` (`Unanswered`: it cannot tell)."""

    async def batch(self, requests: Sequence[dict[str, Json]]) -> Batch:
        """One batch's answers, in order, and its cut states; `Refused` or `Unanswered`."""

    async def checkpoints(self, selector: str) -> list[dict[str, Any]]:
        """The checkpoints `selector`'s provider has loaded, as `/v1/status` tells them."""


def refused(issues: Sequence[ValidationIssue]) -> Refused:
    """The first issue of a batch's 422, as the item it names and what is wrong there."""
    first = issues[0]
    loc = list(first.loc)
    index = loc[2] if len(loc) > 2 and loc[:2] == ["body", "requests"] else 0
    where = ".".join(str(part) for part in loc[3:])
    return Refused(index if isinstance(index, int) else 0, f"{where}: {first.msg}")


def _loaded(status: Status, selector: str) -> list[dict[str, Any]]:
    """The loaded checkpoints of the local provider that serves `selector` (none: hosted)."""
    names = {d.name for d in registry.registered() if selector in {s.name for s in d.selectors}}
    return [
        {
            "provider": provider.name,
            "name": checkpoint.name,
            "verified": checkpoint.verified,
            "precision": checkpoint.precision,
            "calibration": checkpoint.calibration,
        }
        for provider in status.providers
        if provider.name in names
        for checkpoint in provider.checkpoints
    ]


class InService:
    """A `Service` of this process's settings, started and closed with it."""

    def __init__(self, settings: Settings) -> None:
        from decidealot.service import Service

        self.service = Service(settings)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[InService]:
        await self.service.start()
        try:
            yield self
        finally:
            await self.service.close()

    async def check(self, selector: str) -> None:
        try:
            route = (await self.service.catalog.resolve([selector]))[selector]
        except DecidealotError as exc:
            raise Unanswered(exc.message) from None
        if route is None:
            names = [info.name for info in await self.service.catalog.models()]
            raise NotServed(f"not a model this service serves ({', '.join(names)})")

    async def batch(self, requests: Sequence[dict[str, Json]]) -> Batch:
        from decidealot.validation.requests import validate_batch

        try:
            routed = await validate_batch({"requests": list(requests)}, self.service.catalog)
            answered = await self.service.executor.decide_batch(routed)
            return answered.body.results, answered.cuts
        except RequestInvalid as exc:
            raise refused(exc.issues) from None
        except DecidealotError as exc:
            raise Unanswered(f"{exc.code}: {exc.message}") from None

    async def checkpoints(self, selector: str) -> list[dict[str, Any]]:
        return _loaded(self.service.status(), selector)


class AtUrl:
    """A running Decidealot at `url`, called with `key` as its bearer token."""

    def __init__(self, url: str, key: str | None, timeout: float) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per call says nothing new
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(
            base_url=url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )
        self.url = url

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AtUrl]:
        try:
            yield self
        finally:
            await self._client.aclose()

    async def _call(self, method: str, path: str, body: Json = None) -> httpx.Response:
        try:
            if body is None:
                return await self._client.request(method, path)
            content = msgspec.json.encode(body)
            headers = {"Content-Type": "application/json"}
            return await self._client.request(method, path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            raise Unanswered(f"{self.url} is unreachable ({type(exc).__name__})") from None

    def _failed(self, response: httpx.Response, path: str) -> Exception:
        if response.status_code == 401:
            return KeyRefused(
                f"{self.url} refused the key: set DECIDEALOT_API_KEY or --key-file to one it takes"
            )
        try:
            body = msgspec.json.decode(response.content, type=ErrorBody)
            why = f"{body.code}: {body.message}"
        except msgspec.DecodeError:
            why = "no Decidealot body"
        return Unanswered(f"{self.url}{path} answered {response.status_code} ({why})")

    async def check(self, selector: str) -> None:
        response = await self._call("GET", "/v1/models")
        if not response.is_success:
            raise self._failed(response, "/v1/models")
        try:
            names = [m.name for m in msgspec.json.decode(response.content, type=ModelList).models]
        except msgspec.DecodeError:
            raise Unanswered(f"{self.url}/v1/models is not a Decidealot model list") from None
        if selector not in names:
            raise NotServed(f"not a model {self.url} serves ({', '.join(names)})")

    async def batch(self, requests: Sequence[dict[str, Json]]) -> Batch:
        response = await self._call("POST", "/v1/systemone/batch", {"requests": list(requests)})
        if response.status_code == 422:
            try:
                issues = msgspec.json.decode(response.content, type=ValidationErrorBody).detail
            except msgspec.DecodeError:
                issues = []
            if issues:
                raise refused(issues)
        if not response.is_success:
            raise self._failed(response, "/v1/systemone/batch")
        header = response.headers.get(TRUNCATED_HEADER)
        cuts = (read_truncated_header(header) if header is not None else None) or []
        try:
            return msgspec.json.decode(response.content, type=BatchResponse).results, cuts
        except msgspec.DecodeError as exc:
            why = f"{self.url} answered a batch that is not the contract's ({exc})"
            raise Unanswered(why) from None

    async def checkpoints(self, selector: str) -> list[dict[str, Any]]:
        response = await self._call("GET", "/v1/status")
        if not response.is_success:
            raise self._failed(response, "/v1/status")
        try:
            return _loaded(msgspec.json.decode(response.content, type=Status), selector)
        except msgspec.DecodeError:
            raise Unanswered(f"{self.url}/v1/status is not a Decidealot status") from None
