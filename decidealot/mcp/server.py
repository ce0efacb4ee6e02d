"""The MCP server: the HTTP API's four operations as tools, over any `Backend`.

A tool call returns exactly what the HTTP API returns, as structured content (plus the same
JSON as text for clients that read only text). A failure is a tool error (`isError`) whose one
text block is the HTTP API's envelope as JSON, `{"detail": [...]}` for 422, `{"code",
"message", "details"}` for the rest, its messages naming tools where they name HTTP routes; it
has no structured content, since that would have to match the tool's output schema (the
TypeScript SDK and the Inspector check it even on errors; docs/mcp.md). Arguments reach the
tools only after the HTTP API's strict JSON parse
(`decidealot.mcp.strict`, applied by both transports). The server itself holds no state;
`ServiceBackend` runs decisions in this process, and `decidealot.mcp.forward.ForwardingBackend`
sends them to a running Decidealot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from typing import Any, NamedTuple, Protocol

import msgspec
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    DiscoverResult,
    ListToolsResult,
    PaginatedRequestParams,
    RequestParams,
    TextContent,
)

from decidealot import __version__, logs, tracing
from decidealot.contract import (
    TRUNCATED_META,
    Cut,
    ErrorBody,
    Json,
    ValidationErrorBody,
    ValidationIssue,
)
from decidealot.errors import DecidealotError, RequestInvalid, RequestTooLarge, ShuttingDown
from decidealot.ledger import ADMITTED, CUT_SHORT
from decidealot.mcp.strict import rejection
from decidealot.mcp.tools import (
    HTTP_ROUTES,
    INSTRUCTIONS,
    LIST_MODELS,
    SYSTEM_ONE,
    SYSTEM_ONE_BATCH,
    TOOLS,
    UNLOAD_MODELS,
    listing,
)
from decidealot.mcp.versions import SERVED_VERSIONS
from decidealot.service import Service
from decidealot.validation.requests import validate_batch, validate_request

log = logging.getLogger("decidealot.mcp")

Arguments = dict[str, Json]


class ToolFailure(Exception):
    """A call that failed the way the HTTP API would have: `envelope` is its response body."""

    def __init__(self, status: int, envelope: dict[str, Json]) -> None:
        super().__init__(f"tool call failed with status {status}")
        self.status = status
        self.envelope = envelope


class Reply(NamedTuple):
    """A decision tool's result: the HTTP response body, and the questions whose state the
    model read only in part (the HTTP API's `Decidealot-Truncated`; the result's `_meta`)."""

    body: Json
    cuts: list[Cut]


class Backend(Protocol):
    """Where tool calls go. Each method returns the HTTP response (a decision's as a `Reply`)
    or raises ToolFailure."""

    async def system_one(self, arguments: Arguments) -> Reply: ...

    async def system_one_batch(self, arguments: Arguments) -> Reply: ...

    async def list_models(self) -> Json: ...

    async def unload_models(self) -> Json: ...


def failure_of(error: DecidealotError) -> ToolFailure:
    """The envelope the HTTP API answers `error` with."""
    body: msgspec.Struct
    if isinstance(error, RequestInvalid):
        body = ValidationErrorBody(error.issues)
    else:
        body = ErrorBody(error.code, error.message, error.details)
    return ToolFailure(error.status, msgspec.to_builtins(body))


def _reject_arguments(arguments: Arguments) -> None:
    """Tools without parameters reject any, as the validator rejects unknown body fields."""
    if arguments:
        raise failure_of(
            RequestInvalid(
                [
                    ValidationIssue(
                        ["body", name], "Extra inputs are not permitted", "extra_forbidden", value
                    )
                    for name, value in arguments.items()
                ]
            )
        )


def _check_size(arguments: Arguments, limit: int) -> None:
    """The HTTP body limit, applied to the arguments as the JSON body they stand for."""
    if len(msgspec.json.encode(arguments)) > limit:
        raise failure_of(RequestTooLarge())


class ServiceBackend:
    """Runs tool calls on this process's `Service`, through the HTTP API's validator.

    `admits`: each call is admitted here (stdio). False where the transport has admitted the
    request already (the gateway admits every `/mcp` request, and a drain that runs out cuts
    it there), so that the drain's count and the pending bound see an MCP request once."""

    def __init__(self, service: Service, *, admits: bool = True) -> None:
        self._service = service
        self._admits = admits

    async def system_one(self, arguments: Arguments) -> Reply:
        async with self._admitted():
            _check_size(arguments, self._service.settings.max_request_bytes)
            request = await validate_request(arguments, self._service.catalog)
            answered = await self._service.executor.decide(request)
            return Reply(msgspec.to_builtins(answered.body), answered.cuts)

    async def system_one_batch(self, arguments: Arguments) -> Reply:
        async with self._admitted():
            settings = self._service.settings
            _check_size(arguments, settings.max_request_bytes)
            batch = await validate_batch(
                arguments, self._service.catalog, settings.max_batch_requests
            )
            answered = await self._service.executor.decide_batch(batch)
            return Reply(msgspec.to_builtins(answered.body), answered.cuts)

    async def list_models(self) -> Json:
        async with self._admitted():
            return msgspec.to_builtins(await self._service.models())

    async def unload_models(self) -> Json:
        async with self._admitted():
            return msgspec.to_builtins(await self._service.executor.unload())

    @asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """Admission as for HTTP requests, unless the transport admitted the call (then a drain
        that runs out cancels this call, not the transport's request: `Ledger.cut_instead`);
        every error, a cut included, becomes the HTTP API's envelope."""
        service, task = self._service, asyncio.current_task()
        admission: AbstractContextManager[None] = nullcontext()
        if not self._admits:
            admission = service.ledger.cut_instead(ADMITTED.get(), task)
        elif not service.ledger.enter(task):
            raise failure_of(ShuttingDown())
        try:
            with admission, self._cut_answered(task):
                yield
        except DecidealotError as error:
            raise failure_of(error) from None
        except ToolFailure:
            raise
        except Exception as exc:
            logs.log_failure(log, exc, "an MCP tool call")
            raise failure_of(DecidealotError()) from None
        finally:
            if self._admits:
                service.ledger.leave(task)

    @contextmanager
    def _cut_answered(self, task: asyncio.Task[Any] | None) -> Iterator[None]:
        """A call the drain cancelled when it ran out is answered `CUT_SHORT`, as the gateway
        answers an HTTP request it cut."""
        try:
            yield
        except asyncio.CancelledError:
            if task is None or not self._service.ledger.was_cut(task):
                raise
            task.uncancel()
            raise failure_of(CUT_SHORT) from None


def build_server(backend: Backend) -> Server[Any]:
    """A low-level MCP server whose tools are `TOOLS`, answered by `backend`."""
    _quiet_sdk_logs()
    operations: dict[str, Callable[[Arguments], Awaitable[Reply]]] = {
        SYSTEM_ONE: backend.system_one,
        SYSTEM_ONE_BATCH: backend.system_one_batch,
        LIST_MODELS: _without_arguments(backend.list_models),
        UNLOAD_MODELS: _without_arguments(backend.unload_models),
    }

    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        try:
            names = _names(await backend.list_models())
        except ToolFailure:  # a hosted catalog that cannot be read: `model` stays open
            names = None
        return ListToolsResult(tools=listing(names))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        operation = operations.get(params.name)
        if (request_id := logs.request_id.get()) != "-":  # over /mcp; stdio has none
            tracing.annotate(request_id=request_id)  # on the SDK's span for this message
        if operation is None:
            raise MCPError(code=INVALID_PARAMS, message=f"unknown tool {params.name!r}")
        arguments = params.arguments or {}
        refused = rejection(arguments)
        if refused is not None:  # the transport's strict parse refused the arguments
            log.info("tool %s failed with status 422", params.name)
            return _tool_result(refused, is_error=True)
        try:
            body, cuts = await operation(arguments)
        except ToolFailure as failure:
            log.info("tool %s failed with status %d", params.name, failure.status)
            return _tool_result(failure.envelope, is_error=True)
        return _tool_result(body, is_error=False, cuts=cuts)

    def input_schema(name: str) -> dict[str, Any] | None:
        tool = TOOLS.get(name)
        return tool.input_schema if tool is not None else None

    server: Server[Any] = Server(
        "decidealot",
        version=__version__,
        title="Decidealot",
        instructions=INSTRUCTIONS,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )

    async def discover(ctx: ServerRequestContext[Any], params: RequestParams) -> DiscoverResult:
        """The SDK's own answer, naming every version served (it names the 2026 one only)."""
        return DiscoverResult(
            supported_versions=list(SERVED_VERSIONS),
            capabilities=server.get_capabilities(protocol_version=ctx.protocol_version),
            instructions=INSTRUCTIONS,
        )

    server.add_request_handler("server/discover", RequestParams, discover)
    return server


def _quiet_sdk_logs() -> None:
    """The SDK logs every stateless HTTP request at INFO; keep its lines for debug runs."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("mcp").setLevel(logging.WARNING)


def _without_arguments(
    operation: Callable[[], Awaitable[Json]],
) -> Callable[[Arguments], Awaitable[Reply]]:
    async def call(arguments: Arguments) -> Reply:
        _reject_arguments(arguments)
        return Reply(await operation(), [])

    return call


def _names(models: Json) -> list[str] | None:
    """The names in a list_models result."""
    listed = models.get("models") if isinstance(models, dict) else None
    if not isinstance(listed, list):
        return None
    return [m["name"] for m in listed if isinstance(m, dict) and isinstance(m.get("name"), str)]


def _tool_result(body: Json, *, is_error: bool, cuts: list[Cut] | None = None) -> CallToolResult:
    """A result, or an error without structured content: the envelope as text, in tool terms.
    A result whose state was read only in part says so in `_meta` (docs/mcp.md)."""
    if is_error:
        text = msgspec.json.encode(in_tool_terms(body)).decode()
        return CallToolResult(content=[TextContent(text=text)], is_error=True)
    text = msgspec.json.encode(body).decode()
    meta = {TRUNCATED_META: msgspec.to_builtins(cuts)} if cuts else None
    return CallToolResult(content=[TextContent(text=text)], structured_content=body, meta=meta)


def in_tool_terms(envelope: Json) -> Json:
    """An error envelope whose messages name the tools where they name HTTP routes ("use a
    name returned by list_models", not "GET /v1/models"): an agent sees only tools. Forwarded
    envelopes are renamed too; nothing else in them changes."""
    if not isinstance(envelope, dict):
        return envelope
    renamed = dict(envelope)
    if isinstance(message := envelope.get("message"), str):
        renamed["message"] = _renamed(message)
    if isinstance(detail := envelope.get("detail"), list):
        renamed["detail"] = [
            {**issue, "msg": _renamed(issue["msg"])}
            if isinstance(issue, dict) and isinstance(issue.get("msg"), str)
            else issue
            for issue in detail
        ]
    return renamed


def _renamed(text: str) -> str:
    for tool, route in HTTP_ROUTES:
        text = text.replace(route, tool)
    return text
