"""`decidealot mcp`: the MCP tools over stdio, for IDEs and desktop clients; stdout carries only
MCP messages, logs go to stderr. Without `--url` this process is a Decidealot of its own
(`serve`'s startup checks, its own providers). With `--url` it forwards each tool call,
arguments untouched, to a running Decidealot: IDE sessions share one server and its loaded
models, and errors are the server's own envelopes, byte for byte.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any, NoReturn

import anyio
import httpx
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.stdio import stdio_server
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse, RequestId

from decidealot import logs, tracing
from decidealot.config import ConfigError, Settings
from decidealot.contract import TRUNCATED_HEADER, Json, read_truncated_header
from decidealot.errors import ProviderUnavailable
from decidealot.mcp.server import (
    Arguments,
    Backend,
    Reply,
    ServiceBackend,
    ToolFailure,
    build_server,
    failure_of,
)
from decidealot.mcp.strict import (
    SERVED_VERSIONS,
    JsonRpcRefusal,
    checked,
    modern_version,
    unsupported_version,
)
from decidealot.mcp.tools import HTTP_ROUTES, LIST_MODELS, UNLOAD_MODELS
from decidealot.registry import from_env
from decidealot.service import Service

log = logging.getLogger("decidealot.mcp")

_CONNECT_SECONDS = 10.0
_UNWIND_SECONDS = 0.5  # for cancelled tool calls to unwind before the backend closes under them


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="decidealot mcp", description="Serve Decidealot's MCP tools over stdio."
    )
    parser.add_argument(
        "--url",
        type=_base_url,
        help="forward tool calls to the Decidealot at this base URL (e.g. http://127.0.0.1:8080) "
        "instead of running providers here; its key is read from DECIDEALOT_API_KEY",
    )
    args = parser.parse_args(argv)
    try:
        settings = from_env()
    except ConfigError as exc:
        print(f"decidealot mcp: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    tracing.setup(settings)
    if args.url is None:
        from decidealot import preflight  # huggingface_hub: only when needed

        try:
            preflight.ready_to_serve(settings, progress=False, rehash=False)
        except preflight.ERRORS as exc:
            print(f"decidealot mcp: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ConfigError) else 1
    # Closing stdin, SIGTERM and Ctrl-C are all normal ends. A signal ends the process inside
    # `_serve`; the suppression covers one that arrives before its handlers are in place.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(settings, args.url))
    tracing.shutdown()
    return 0


def _base_url(raw: str) -> str:
    try:
        url = httpx.URL(raw.strip())
    except httpx.InvalidURL:
        url = httpx.URL()
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError("expected an http:// or https:// URL")
    if url.userinfo:  # credentials belong in DECIDEALOT_API_KEY, never in argv or logs
        raise argparse.ArgumentTypeError("put the key in DECIDEALOT_API_KEY, not in the URL")
    return str(url).rstrip("/")


async def _serve(settings: Settings, url: str | None) -> None:
    """Serve until the client closes stdin; SIGINT or SIGTERM end the process, exit status 0,
    the session cancelled but not awaited to the end (see `_leave_now`)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with _backend(settings, url) as backend:
        session = asyncio.create_task(_session(backend))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait((session, stopping), return_when=asyncio.FIRST_COMPLETED)
        if session.done():
            stopping.cancel()
            session.result()  # a failure of the session is this process's failure
            return
        session.cancel()
        await asyncio.wait((session,), timeout=_UNWIND_SECONDS)
    _leave_now()


@contextlib.asynccontextmanager
async def _backend(settings: Settings, url: str | None) -> AsyncIterator[Backend]:
    """The tools' backend, closed on the way out (provider workers stopped)."""
    if url is not None:
        key = settings.api_key[0] if settings.api_key else None  # the first of several
        # long enough for the server to start a provider and answer; it bounds both itself
        answer = settings.provider_start_timeout_seconds + settings.provider_timeout_seconds
        forwarding = ForwardingBackend(url, key, httpx.Timeout(answer, connect=_CONNECT_SECONDS))
        log.info("MCP over stdio, forwarding to %s", url)
        try:
            yield forwarding
        finally:
            await forwarding.close()
        return
    service = Service(settings)
    await service.start()
    names = [provider.name for provider in service.providers]
    log.info("MCP over stdio, providers: %s", ", ".join(names) or "none")
    try:
        yield ServiceBackend(service)
    finally:
        await service.close()


async def _session(
    backend: Backend, wire: AsyncIterable[bytes] | None = None, stdout: Any = None
) -> None:
    """One MCP session over `wire` (None: stdin) and `stdout`, answering every line read before
    it ends: at end of file the SDK cancels the requests it still runs and would lose a refusal
    not yet written, so it sees the end of its input only once everything owed is written."""
    server = build_server(backend)
    owed = _Owed()
    to_client, from_server = anyio.create_memory_object_stream[SessionMessage](0)
    lines = _claim_stdin() if wire is None else wire
    stdin: Any = _screened(lines, to_client.clone(), owed)  # the SDK only iterates it
    async with (
        stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream),
        anyio.create_task_group() as relaying,
    ):
        relaying.start_soon(_relay, from_server, write_stream, owed)
        await server.run(read_stream, to_client, server.create_initialization_options())


class _Owed:
    """The requests passed to the SDK and not answered yet, by id as the SDK correlates them
    (`"7"` and `7` are one id), repeats counted."""

    def __init__(self) -> None:
        self._ids: Counter[RequestId] = Counter()
        self._none = asyncio.Event()
        self._none.set()

    def owe(self, request_id: RequestId) -> None:
        self._ids[coerce_request_id(request_id)] += 1
        self._none.clear()

    def settle(self, request_id: RequestId) -> None:
        """`request_id` was answered, or cancelled (the spec forbids answering a cancelled
        request); an id not owed is ignored (a Counter's `-=` keeps positive counts only)."""
        self._ids -= Counter([coerce_request_id(request_id)])
        if not self._ids:
            self._none.set()

    async def paid(self) -> None:
        await self._none.wait()


async def _relay(
    from_server: MemoryObjectReceiveStream[SessionMessage],
    to_client: MemoryObjectSendStream[SessionMessage],
    owed: _Owed,
) -> None:
    """The SDK's messages and `_screened`'s refusals to stdout, each answer settling its request."""
    async with from_server, to_client:
        async for message in from_server:
            await to_client.send(message)
            answer = message.message
            if isinstance(answer, JSONRPCResponse | JSONRPCError) and answer.id is not None:
                owed.settle(answer.id)


def _claim_stdin() -> anyio.AsyncFile[bytes]:
    """The wire on a private descriptor, fd 0 pointed at the null device, as the SDK does when
    it reads stdin itself: provider workers and stray reads never take the client's lines. The
    private descriptor is never closed: the reading thread may outlive the session."""
    wire = os.fdopen(os.dup(0), "rb", closefd=False)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return anyio.wrap_file(wire)


async def _screened(
    wire: AsyncIterable[bytes], to_client: MemoryObjectSendStream[SessionMessage], owed: _Owed
) -> AsyncIterator[str]:
    """stdin as the SDK reads it (UTF-8 lines, blank ones skipped), each `checked` first: a
    refused line, or a 2026-07-28 request naming a version not served, never reaches the SDK
    (which would answer it nothing); its refusal goes `to_client`. Each request passed on is
    `owed` an answer (a `notifications/cancelled` settles the one it names)."""
    async with to_client:
        async for line in wire:
            if not line.strip():
                continue
            try:
                screened, message = await asyncio.to_thread(checked, line)  # off the loop
                version = modern_version(message)
                if version is not None and version not in SERVED_VERSIONS:
                    raise unsupported_version(str(version), getattr(message, "id", None))
            except JsonRpcRefusal as refusal:
                await to_client.send(SessionMessage(refusal.answer))
                continue
            if isinstance(message, JSONRPCRequest):
                owed.owe(message.id)
            elif (
                isinstance(message, JSONRPCNotification)
                and message.method == "notifications/cancelled"
                and (cancelled := cancelled_request_id_from_params(message.params)) is not None
            ):
                owed.settle(cancelled)
            yield screened.decode("utf-8", errors="replace")
        await owed.paid()


def _leave_now() -> NoReturn:
    """End the process at once after a signal, the backend closed: the SDK's stdin reader is a
    non-daemon thread blocked in read() while the client holds its end of the pipe open, which
    asyncio.run and the interpreter would wait for forever. MCP messages are already flushed."""
    log.info("MCP over stdio stopped")
    tracing.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class ForwardingBackend:
    """Calls each tool's route at `base_url`; `api_key` is sent as the bearer token when given."""

    def __init__(self, base_url: str, api_key: str | None, timeout: httpx.Timeout) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)

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
