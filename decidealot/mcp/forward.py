"""A `Backend` that forwards tool calls to a running Decidealot over its HTTP API.

`decidealot mcp --url` uses it so that many IDE sessions share one server and its loaded
models instead of each starting providers of its own. Arguments go upstream untouched: the
server's validator answers, so errors are the server's own envelopes, byte for byte.
"""

from __future__ import annotations

import logging

import httpx
import msgspec

from decidealot import tracing
from decidealot.contract import TRUNCATED_HEADER, Json, read_truncated_header
from decidealot.errors import ProviderUnavailable
from decidealot.mcp.server import Arguments, Reply, ToolFailure, failure_of
from decidealot.mcp.tools import HTTP_ROUTES, LIST_MODELS, UNLOAD_MODELS

log = logging.getLogger("decidealot.mcp")


class ForwardingBackend:
    """Calls each tool's route at `base_url`; `api_key` is sent as the bearer token when given."""

    def __init__(self, base_url: str, api_key: str | None, timeout: httpx.Timeout) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def call(self, tool: str, arguments: Arguments) -> Reply:
        """The server's answer, with the cuts its `Decidealot-Truncated` header names."""
        method, path = HTTP_ROUTES[tool].split()
        headers: dict[str, str] = {}
        content = None
        if tool not in (LIST_MODELS, UNLOAD_MODELS):  # the routes without a body
            content = msgspec.json.encode(arguments)
            headers["Content-Type"] = "application/json"
        tracing.inject(headers)
        try:
            response = await self._client.request(method, path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("the --url server is unreachable: %s", type(exc).__name__)
            raise _unreachable() from None
        try:
            answer = msgspec.json.decode(response.content)
        except msgspec.DecodeError:
            answer = None
        if response.is_success and isinstance(answer, dict):
            header = response.headers.get(TRUNCATED_HEADER)
            cuts = read_truncated_header(header) if header is not None else []
            if cuts is None:
                log.warning(
                    "the --url server sent a %s header that cannot be read", TRUNCATED_HEADER
                )
            return Reply(answer, cuts or [])
        if not response.is_success and _is_envelope(answer):
            raise ToolFailure(response.status_code, answer)
        log.warning(
            "the --url server answered %s %s with status %d and no Decidealot body",
            method,
            path,
            response.status_code,
        )
        raise _unreachable()


def _is_envelope(answer: Json) -> bool:
    """The server's 422 `{"detail": [...]}` or its `{"code", "message", ...}` envelope."""
    if not isinstance(answer, dict):
        return False
    if "detail" in answer:
        return isinstance(answer["detail"], list)
    return isinstance(answer.get("code"), str) and isinstance(answer.get("message"), str)


def _unreachable() -> ToolFailure:
    return failure_of(ProviderUnavailable("the Decidealot server is unreachable"))
