"""What both transports check each incoming JSON-RPC message against before the SDK parses it,
and what a message they refuse is told (docs/mcp.md). The SDK parses leniently (a duplicate key
keeps its last value, `10**30` and `NaN` are numbers, a lone surrogate is a string), so `screen`
replaces the raw `arguments` of a `tools/call` that the HTTP API's strict parser refuses by a
marker holding its 422 envelope, answered as a tool error (`rejection`); arguments that pass are
left byte for byte. `checked` then holds the whole message to the SDK's schema, strictly. The SDK
names only 2026-07-28 in `server/discover` and -32022; both transports name `SERVED_VERSIONS`.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import msgspec
from mcp_types import (
    INVALID_REQUEST,
    PARSE_ERROR,
    PROTOCOL_VERSION_META_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCRequest,
    RequestId,
    UnsupportedProtocolVersionErrorData,
    jsonrpc_message_adapter,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from decidealot.contract import Json, ValidationErrorBody
from decidealot.errors import RequestInvalid
from decidealot.validation.strict_json import parse_json

SERVED_VERSIONS = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)

_MARKER = f"decidealot.rejected.{secrets.token_hex(16)}"  # per process: no client can forge one

_LENIENT = json.JSONDecoder()
_WHITESPACE = " \t\n\r"

Span = tuple[int, int]


def screen(message: bytes) -> bytes:
    # surrogateescape: undecodable bytes survive the round trip, and the strict parser
    # reports them as the HTTP API does
    text = message.decode("utf-8", errors="surrogateescape")
    try:
        envelope, _ = _members(text, _skip(text, 0))
        if _value(text, envelope.get("method")) != "tools/call" or "params" not in envelope:
            return message
        params, _ = _members(text, envelope["params"][0])
    except (ValueError, IndexError, RecursionError):  # not a JSON-RPC object: the SDK answers
        return message
    if "arguments" not in params:
        return message
    start, end = params["arguments"]
    try:
        parse_json(text[start:end].encode("utf-8", errors="surrogateescape"))
    except RequestInvalid as error:
        marker = {_MARKER: msgspec.to_builtins(ValidationErrorBody(error.issues))}
        spliced = text[:start] + json.dumps(marker) + text[end:]
        return spliced.encode("utf-8", errors="surrogateescape")
    return message


BATCH_REFUSED = (
    "Invalid Request: JSON-RPC batches are not accepted; send each message on its own "
    "(MCP versions after 2025-03-26 have no batches, and this server takes none in 2025-03-26)"
)


class JsonRpcRefusal(Exception):
    """A message refused before the SDK sees it: `answer` is the JSON-RPC error it is told."""

    def __init__(
        self, code: int, message: str, data: Any = None, request_id: RequestId | None = None
    ) -> None:
        super().__init__(message)
        error = ErrorData(code=code, message=message)
        if data is not None:  # set only when given: an unset field is left out of the JSON
            error.data = data
        self.answer = JSONRPCError(jsonrpc="2.0", id=request_id, error=error)


def refusal_of(message: bytes) -> JsonRpcRefusal:
    """What a message the SDK's strict schema refuses is told: a parse error, a refused batch,
    or an invalid request (with its id when it has a usable one)."""
    try:
        decoded = json.loads(message)
    except (ValueError, RecursionError):
        return JsonRpcRefusal(PARSE_ERROR, "Parse error: the message is not JSON")
    if isinstance(decoded, list):
        return JsonRpcRefusal(INVALID_REQUEST, BATCH_REFUSED)
    request_id = decoded.get("id") if isinstance(decoded, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    return JsonRpcRefusal(
        INVALID_REQUEST,
        "Invalid Request: not one JSON-RPC 2.0 message as the MCP schema states it",
        request_id=request_id,
    )


def checked(raw: bytes) -> tuple[bytes, JSONRPCMessage]:
    """`raw` screened, and as the SDK will read it, if it is one JSON-RPC message exactly as
    the SDK's schema states it (its own parse is lax: `"code": true` passes as an integer, and
    on stdio a line it cannot read is answered nothing); else the `JsonRpcRefusal` to answer."""
    screened = screen(raw)
    try:
        message = jsonrpc_message_adapter.validate_json(screened, strict=True)
    except ValueError:  # pydantic's ValidationError, and invalid JSON
        raise refusal_of(screened) from None
    return screened, message


def modern_version(message: JSONRPCMessage) -> object | None:
    """The version a 2026-07-28 request names in `params._meta`; None for any other message."""
    if not isinstance(message, JSONRPCRequest) or not message.params:
        return None
    meta = message.params.get("_meta")
    return meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None


def unsupported_version(requested: str, request_id: RequestId | None) -> JsonRpcRefusal:
    """-32022, naming every version served."""
    data = UnsupportedProtocolVersionErrorData(supported=list(SERVED_VERSIONS), requested=requested)
    return JsonRpcRefusal(
        UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version {requested!r}: this server speaks "
        f"{', '.join(SERVED_VERSIONS)}",
        data.model_dump(mode="json"),
        request_id,
    )


def rejection(arguments: dict[str, Json]) -> Json:
    """The 422 envelope `screen` put in place of refused arguments; None for real ones."""
    if len(arguments) == 1 and _MARKER in arguments:
        return arguments[_MARKER]
    return None


def _skip(text: str, at: int) -> int:
    while text[at] in _WHITESPACE:
        at += 1
    return at


def _members(text: str, at: int) -> tuple[dict[str, Span], int]:
    """The spans of an object's member values (the last of a repeated key, as the SDK keeps),
    and where the object ends; ValueError or IndexError when `at` holds no object."""
    if text[at] != "{":
        raise ValueError("not an object")
    spans: dict[str, Span] = {}
    at = _skip(text, at + 1)
    if text[at] == "}":
        return spans, at + 1
    while True:
        if text[at] != '"':
            raise ValueError("not a key")
        key, at = json.decoder.scanstring(text, at + 1)
        at = _skip(text, at)
        if text[at] != ":":
            raise ValueError("no colon")
        start = _skip(text, at + 1)
        _, end = _LENIENT.raw_decode(text, start)
        spans[key] = (start, end)
        at = _skip(text, end)
        if text[at] == "}":
            return spans, at + 1
        if text[at] != ",":
            raise ValueError("no comma")
        at = _skip(text, at + 1)


def _value(text: str, span: Span | None) -> Json:
    return None if span is None else _LENIENT.decode(text[span[0] : span[1]])
