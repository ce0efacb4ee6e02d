"""The MCP server: the HTTP API's four operations as tools, over a `Backend` (`ServiceBackend` in
this process, `stdio.ForwardingBackend` on a running Decidealot). A result is the HTTP response
body, as structured content and as text; a failure, a tool error whose text is the HTTP API's
envelope in tool terms, with no structured content, which clients check against the output
schema even on errors (docs/mcp.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
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
from decidealot.contract import TRUNCATED_META, Cut, Json, ValidationIssue
from decidealot.errors import DecidealotError, RequestInvalid, RequestTooLarge, ShuttingDown
from decidealot.ledger import ADMITTED, CUT_SHORT
from decidealot.mcp.strict import SERVED_VERSIONS, rejection
from decidealot.mcp.tools import (
    HTTP_ROUTES,
    INSTRUCTIONS,
    LIST_MODELS,
    SYSTEM_ONE,
    TOOLS,
    UNLOAD_MODELS,
    listing,
)
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
    """A tool's result: the HTTP response body, and its cuts (`Decidealot-Truncated`, `_meta`)."""

    body: Json
    cuts: list[Cut]


class Backend(Protocol):
    """Where tool calls go: `call` answers as the tool's HTTP route does, or raises ToolFailure."""

    async def call(self, tool: str, arguments: Arguments) -> Reply: ...


def failure_of(error: DecidealotError) -> ToolFailure:
    return ToolFailure(error.status, msgspec.to_builtins(error.envelope()))


class ServiceBackend:
    """Runs tool calls on this process's `Service`, through the HTTP API's validator. `admits`
    each call (stdio), or not where the gateway admitted the `/mcp` request already, so that
    the drain's count and the pending bound see an MCP request once."""

    def __init__(self, service: Service, *, admits: bool = True) -> None:
        self._service = service
        self._admits = admits

    async def call(self, tool: str, arguments: Arguments) -> Reply:
        service = self._service
        async with self._admitted():
            if tool == LIST_MODELS:
                return Reply(msgspec.to_builtins(await service.models()), [])
            if tool == UNLOAD_MODELS:
                return Reply(msgspec.to_builtins(await service.executor.unload()), [])
            # the HTTP body limit, applied to the arguments as the JSON body they stand for
            if len(msgspec.json.encode(arguments)) > service.settings.max_request_bytes:
                raise RequestTooLarge()
            if tool == SYSTEM_ONE:
                request = await validate_request(arguments, service.catalog)
                answered = await service.executor.decide(request)
            else:
                limit = service.settings.max_batch_requests
                batch = await validate_batch(arguments, service.catalog, limit)
                answered = await service.executor.decide_batch(batch)
            return Reply(msgspec.to_builtins(answered.body), answered.cuts)

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
            with admission:
                try:
                    yield
                except asyncio.CancelledError:
                    # a drain that ran out cut the call (asked here: `admission` forgets it on
                    # exit): answered `CUT_SHORT`, as the gateway answers an HTTP request it cut
                    if task is None or not service.ledger.was_cut(task):
                        raise
                    task.uncancel()
                    raise failure_of(CUT_SHORT) from None
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


def build_server(backend: Backend) -> Server[Any]:
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        # the SDK logs every stateless HTTP request at INFO: keep its lines for debug runs
        logging.getLogger("mcp").setLevel(logging.WARNING)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        try:
            names = _names((await backend.call(LIST_MODELS, {})).body)
        except ToolFailure:  # a hosted catalog that cannot be read: `model` stays open
            names = None
        return ListToolsResult(tools=listing(names))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        if (request_id := logs.request_id.get()) != "-":  # over /mcp; stdio has none
            tracing.annotate(request_id=request_id)  # on the SDK's span for this message
        if params.name not in TOOLS:
            raise MCPError(code=INVALID_PARAMS, message=f"unknown tool {params.name!r}")
        arguments = params.arguments or {}
        try:
            if (refused := rejection(arguments)) is not None:  # by the transport's strict parse
                raise ToolFailure(422, refused)
            if arguments and params.name in (LIST_MODELS, UNLOAD_MODELS):
                # tools without parameters reject any, as the validator rejects unknown fields
                extra = "Extra inputs are not permitted"
                issues = [
                    ValidationIssue(["body", name], extra, "extra_forbidden", value)
                    for name, value in arguments.items()
                ]
                raise failure_of(RequestInvalid(issues))
            body, cuts = await backend.call(params.name, arguments)
        except ToolFailure as failure:
            log.info("tool %s failed with status %d", params.name, failure.status)
            text = msgspec.json.encode(in_tool_terms(failure.envelope)).decode()
            return CallToolResult(content=[TextContent(text=text)], is_error=True)
        text = msgspec.json.encode(body).decode()
        meta = {TRUNCATED_META: msgspec.to_builtins(cuts)} if cuts else None  # docs/mcp.md
        return CallToolResult(content=[TextContent(text=text)], structured_content=body, meta=meta)

    server: Server[Any] = Server(
        "decidealot",
        version=__version__,
        title="Decidealot",
        instructions=INSTRUCTIONS,
        get_tool_input_schema=lambda name: TOOLS[name].input_schema if name in TOOLS else None,
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


def _names(models: Json) -> list[str] | None:
    listed = models.get("models") if isinstance(models, dict) else None
    if not isinstance(listed, list):
        return None
    return [m["name"] for m in listed if isinstance(m, dict) and isinstance(m.get("name"), str)]


def in_tool_terms(envelope: Json) -> Json:
    """An error envelope (forwarded ones too) whose messages name the tools where they name HTTP
    routes ("list_models", not "GET /v1/models"): an agent sees only tools. Nothing else changes."""
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
    for tool, route in HTTP_ROUTES.items():
        text = text.replace(route, tool)
    return text
