"""Hostile requests for the property-based tests, and what every answer to one must be.

`bodies()` draws requests to the HTTP body path in every framing it reads or refuses: every
accepted Content-Encoding spelling and refused ones, stacked encodings (in the body and in the
header), multi-member gzip and multi-frame zstd, streamed zstd frames whose windows sit at and
around the limit, truncated and garbled frames, the zstd magic number before random bytes,
decoded and wire sizes at and around the limit, wrong and missing media types, chunked or with
a length. `stdio_lines()` draws lines for `decidealot mcp`. `problem` and `mcp_problem` say
what is wrong with an answer (None: nothing): never a 5xx, always one of our envelopes (or a
JSON-RPC message from /mcp). The quick loop runs these in process (tests/unit), the slow tier
over real servers (tests/e2e), with the same strategies.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import zstandard
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from mcp_types import JSONRPCRequest

from decidealot.asgi.body import zstd_window_limit
from decidealot.mcp.strict import JsonRpcRefusal, checked

LIMIT = 4096
"""DECIDEALOT_MAX_REQUEST_BYTES of every server these requests go to."""
MCP_FRAMING = 64 * 1024
"""What /mcp allows above the limit for the JSON-RPC envelope (decidealot.mcp.http)."""
ROUTES = ("/v1/systemone", "/v1/systemone/batch", "/mcp")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def quick(examples: int) -> Any:
    """Hypothesis settings for a fixed, reproducible budget: same examples every run."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def limit_of(route: str) -> int:
    return LIMIT + MCP_FRAMING if route == "/mcp" else LIMIT


# -- documents -------------------------------------------------------------------------------

_QUESTIONS = {
    "queue": {"type": "choice", "criteria": {"billing": "money", "tech": "broken"}},
    "urgency": {"type": "score", "criteria": ["low", "high"]},
    "review": {"type": "noul", "instructions": "Needs a human?"},
}


def _request(model: str) -> dict[str, Any]:
    return {"model": model, "state": {"ticket": "charged twice"}, "questions": _QUESTIONS}


def _rpc(method: str, params: Any, request_id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if request_id is not None:
        message["id"] = request_id
    return message


_MODELS = st.sampled_from(["laya", "von", "clm", "jev-latest", "nope", ""])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_IDS = st.one_of(
    st.integers(0, 2**31),  # most clients
    st.integers(-(2**70), 2**70) | st.text(max_size=8) | st.none() | st.booleans() | st.floats(),
)


@st.composite
def _rest_document(draw: st.DrawFn, route: str) -> dict[str, Any]:
    request: dict[str, Any] = _request(draw(_MODELS))
    if draw(st.booleans()):
        request[draw(st.sampled_from(["state", "questions", "config", "model", "extra"]))] = draw(
            _JSON
        )
    return (
        request if route == "/v1/systemone" else {"requests": [request] * draw(st.integers(0, 3))}
    )


@st.composite
def _rpc_document(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON-RPC message: mostly tool calls, some other methods, notifications and junk."""
    method = draw(
        st.sampled_from(
            [
                "tools/call",
                "tools/call",
                "tools/list",
                "initialize",
                "ping",
                "notifications/initialized",
                "resources/list",
                "nope",
            ]
        )
    )
    if method == "tools/call":
        tool = draw(st.sampled_from(["system_one", "system_one_batch", "list_models", "nope"]))
        route = "/v1/systemone/batch" if tool == "system_one_batch" else "/v1/systemone"
        arguments = draw(st.one_of(_rest_document(route), _JSON))
        params: Any = {"name": tool, "arguments": arguments}
    elif method == "initialize":
        params = {"protocolVersion": draw(st.sampled_from(["2025-06-18", "2024-11-05", "x"])),
                  "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}  # fmt: skip
    else:
        params = draw(st.none() | _JSON)
    request_id = None if method.startswith("notifications/") else draw(_IDS)
    return _rpc(method, params, request_id)


def _encode_json(document: Any) -> bytes:
    return json.dumps(document, allow_nan=True).encode()


@st.composite
def _payload(draw: st.DrawFn, route: str) -> bytes:
    """The decoded body: a document (often padded to sizes at and around the limit), random
    bytes, or JSON-shaped text."""
    kind = draw(st.sampled_from(["document"] * 6 + ["bytes", "json"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "json":
        return _encode_json(draw(_JSON))
    document = draw(_rpc_document() if route == "/mcp" else _rest_document(route))
    raw = _encode_json(document)
    limit = limit_of(route)
    size = draw(st.sampled_from([None, None, limit - 1, limit, limit + 1, 3 * limit]))
    if size is not None and size > len(raw):
        raw += b" " * (size - len(raw))  # JSON allows trailing whitespace
    return raw


# -- encodings -------------------------------------------------------------------------------


def _zstd_streamed(data: bytes, window_log: int) -> bytes:
    """A frame as a streaming compressor writes it: no content size, the given window."""
    params = zstandard.ZstdCompressionParameters(window_log=window_log, write_content_size=False)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    return compressor.compress(data) + compressor.flush()


@st.composite
def _encoded(draw: st.DrawFn, route: str, data: bytes) -> tuple[bytes, list[str]]:
    """`data` through zero to two codecs, innermost first; the codecs' names."""
    names: list[str] = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2]))):
        codec = draw(
            st.sampled_from(["gzip", "gzip-members", "zstd", "zstd-stream", "zstd-frames"])
        )
        if codec == "gzip":
            data = gzip.compress(data, draw(st.integers(0, 9)))
        elif codec == "gzip-members":  # another member follows, as `cat a.gz b.gz`
            cut = draw(st.integers(0, len(data)))
            data = gzip.compress(data[:cut]) + gzip.compress(data[cut:])
        elif codec == "zstd":  # one shot: the frame declares its content size
            data = zstandard.ZstdCompressor(level=draw(st.integers(1, 19))).compress(data)
        elif codec == "zstd-stream":  # windows at and around the limit, and zstd's default
            window = zstd_window_limit(limit_of(route)).bit_length() - 1
            window_log = draw(st.sampled_from([10, window - 1, window, window + 1, 27]))
            data = _zstd_streamed(data, max(10, window_log))
        else:
            cut = draw(st.integers(0, len(data)))
            data = zstandard.compress(data[:cut]) + zstandard.compress(data[cut:])
        names.append("gzip" if codec.startswith("gzip") else "zstd")
    return data, names


@st.composite
def _damaged(draw: st.DrawFn, data: bytes) -> bytes:
    how = draw(st.sampled_from(["none"] * 6 + ["truncate", "flip", "append"]))
    if how == "truncate" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip" and data:
        garbled = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            garbled[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(garbled)
    if how == "append":
        return data + draw(st.binary(min_size=1, max_size=64))
    return data


_FRAME_FLAGS = [0x00, 0x04, 0x40, 0x80, 0x01, 0x20, 0x24, 0xE4, 0x08]
"""Frame header descriptors: with a window descriptor (a checksum, content sizes of each
width, a dictionary id) or without (single segment), and a reserved bit set."""
_WINDOWS = [0xB0, 0xF8, 0xFF, 0xA8, 0x58, 0x18, 0x11, 0x10, 0x00]
"""Window descriptors: past zstd's most (2^32 up to 2^41), its most (2 GiB), 8 MiB, around the
4 KiB limit and its least (1 KiB)."""


@st.composite
def _zstd_header(draw: st.DrawFn) -> bytes:
    """The zstd magic number, then a frame header (its flags, its window descriptor, its sizes)
    and blocks of random bytes."""
    flags = draw(st.sampled_from(_FRAME_FLAGS))
    window = draw(st.sampled_from(_WINDOWS))
    return ZSTD_MAGIC + bytes([flags, window]) + draw(st.binary(max_size=96))


_ENCODING_SPELLINGS = [
    *("gzip", "x-gzip", "GZIP", "Zstd", "zstd", "identity", "", "x"),
    *("br", "deflate", "gzip, zstd", "zstd, gzip", "compress", "gzip;q=1"),
]
_MEDIA_TYPES = [
    *("application/json", None, "application/json; charset=utf-8", "APPLICATION/JSON"),
    *("application/vnd.api+json", "application/x-www-form-urlencoded", "text/plain"),
    *("multipart/form-data; boundary=x", "application/xml", "json", "", ";", "*/*"),
    "application/json; charset=latin-1",
]


@dataclass(frozen=True)
class Body:
    """One request to the body path; `pieces` sends it chunked, without a Content-Length."""

    route: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False

    def content(self) -> bytes | Iterator[bytes]:
        if not self.chunked:
            return self.body
        return iter([self.body[i : i + 1000] for i in range(0, len(self.body), 1000)] or [b""])


@st.composite
def bodies(draw: st.DrawFn, routes: tuple[str, ...] = ROUTES) -> Body:
    route = draw(st.sampled_from(routes))
    headers: dict[str, str] = {}
    if draw(st.sampled_from([True, False, False])):  # a zstd frame header, sent as zstd
        headers = {"content-encoding": "zstd", "content-type": "application/json"}
        if route == "/mcp":
            headers["accept"] = "application/json, text/event-stream"
        return Body(route, draw(_zstd_header()), headers, chunked=draw(st.booleans()))
    data, codecs = draw(_encoded(route, draw(_payload(route))))
    data = draw(_damaged(data))
    header = draw(st.sampled_from(["truthful"] * 6 + ["outer", "other", "none"]))
    if header == "truthful" and codecs:
        headers["content-encoding"] = ", ".join(reversed(codecs))  # stacked: outermost first
    elif header == "outer" and codecs:
        headers["content-encoding"] = codecs[-1]
    elif header == "other":
        headers["content-encoding"] = draw(st.sampled_from(_ENCODING_SPELLINGS))
    media_type = draw(st.sampled_from(_MEDIA_TYPES[:5] * 4 + _MEDIA_TYPES))
    if media_type is None and route == "/mcp" and not draw(st.booleans()):
        media_type = "application/json"  # the one check /mcp adds: keep it a small share
    if media_type is not None:
        headers["content-type"] = media_type
    if route == "/mcp":
        headers["accept"] = "application/json, text/event-stream"
    return Body(route, data, headers, chunked=draw(st.booleans()))


def _refused_arguments(arguments: bytes) -> bytes:
    """A tool call at /mcp's limit whose arguments the strict parser refuses: the screen puts
    their 422 envelope in their place, which is larger than they are."""
    head = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "system_one", '
    body = head + b'"arguments": ' + arguments + b"}}"
    return body + b" " * (limit_of("/mcp") - len(body))


_MCP = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
_ASTRAL_KEY = b'"' + "\U0001f600".encode() * ((limit_of("/mcp") - 200) // 8) + b'"'
FOUND: dict[str, Body] = {
    "a zstd window past zstd's own maximum": Body(
        "/v1/systemone", ZSTD_MAGIC + b"\x00\xb0", {"content-encoding": "zstd"}
    ),
    "refused arguments at the /mcp limit": Body(
        "/mcp", _refused_arguments(b"[-" + b"9" * 30 + b"]"), _MCP
    ),
    "a duplicate astral key at the /mcp limit": Body(
        "/mcp", _refused_arguments(b"{" + _ASTRAL_KEY + b": 1, " + _ASTRAL_KEY + b": 2}"), _MCP
    ),
}
"""Bodies these strategies found that once got a 500 or the SDK's plain-text 413, kept as
fixed cases whatever the strategies draw."""


@st.composite
def stdio_lines(draw: st.DrawFn) -> list[bytes]:
    """What an MCP client might write on `decidealot mcp`'s stdin after initializing: JSON-RPC
    messages, JSON that is not one, random bytes and broken UTF-8, one per line."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["rpc", "rpc", "rpc", "json", "bytes", "cut"]))
        if kind == "rpc":
            line = _encode_json(draw(_rpc_document()))
        elif kind == "json":
            line = _encode_json(draw(_JSON))
        elif kind == "bytes":
            line = draw(st.binary(max_size=200)).replace(b"\n", b" ")
        else:
            line = _encode_json(draw(_rpc_document()))
            line = line[: draw(st.integers(0, len(line)))]
        lines.append(line)
    return lines


OPENING = [
    json.dumps(
        _rpc(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "fuzz", "version": "0"},
            },
            0,
        )
    ).encode(),
    json.dumps(_rpc("notifications/initialized", None, None)).encode(),
]
"""The lines a client opens a stdio session with."""


def answers_due(lines: list[bytes]) -> list[object]:
    """The ids of the answers `decidealot mcp` owes `lines`: one to every line but a blank one
    or a notification, its request's id, or null where it has none that can be read (a line
    that is not one JSON-RPC message: `decidealot.mcp.strict.checked`)."""
    ids: list[object] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            _, message = checked(line)
        except JsonRpcRefusal as refusal:
            ids.append(refusal.answer.id)
            continue
        if isinstance(message, JSONRPCRequest):
            ids.append(message.id)
    return ids


# -- what an answer must be ------------------------------------------------------------------


def envelope_problem(status: int, body: Any) -> str | None:
    """None when `body` is one of our envelopes for `status` (4xx): the TypeSafe 422 or
    `{"code", "message", "details"}`."""
    if not isinstance(body, dict):
        return f"{status} answered {body!r}, not an envelope"
    if status == 422:
        issues = body.get("detail")
        ok = (
            set(body) == {"detail"}
            and isinstance(issues, list)
            and all(
                isinstance(issue, dict) and set(issue) == {"loc", "msg", "type", "input"}
                for issue in issues
            )
        )
        return None if ok else f"422 is not the validation envelope: {body!r}"[:500]
    if set(body) != {"code", "message", "details"} or not isinstance(body["code"], str):
        return f"{status} is not the error envelope: {body!r}"[:500]
    return None


def problem(route: str, status: int, headers: Any, raw: bytes) -> str | None:
    """What is wrong with the answer to a request at `route`; None: nothing."""
    if status >= 500:
        return f"{status}: {raw[:300]!r}"
    if "x-request-id" not in headers:
        return f"{status} without x-request-id"
    if route == "/mcp":
        return mcp_problem(status, headers, raw)
    try:
        body = json.loads(raw)
    except ValueError:
        return f"{status} answered non-JSON {raw[:300]!r}"
    if status == 200:
        key = "answers" if route == "/v1/systemone" else "results"
        return None if isinstance(body, dict) and key in body else f"200 without {key}: {body!r}"
    return envelope_problem(status, body)


def mcp_problem(status: int, headers: Any, raw: bytes) -> str | None:
    """/mcp answers JSON-RPC (as JSON or as server-sent events) or 202 to a notification;
    a body it cannot take gets our envelope, a header the SDK checks the SDK's error."""
    if status == 202:
        return None
    try:
        if headers.get("content-type", "").startswith("text/event-stream"):
            lines = re.split(r"\r\n|\r|\n", raw.decode())  # SSE's line ends, and no others
            data = [line[5:].strip() for line in lines if line.startswith("data:")]
            messages = [json.loads(item) for item in data if item]
        else:
            messages = [json.loads(raw)]
    except ValueError:
        return f"{status} answered {raw[:300]!r}"
    if status != 200:
        (body,) = messages
        if isinstance(body, dict) and body.get("jsonrpc") == "2.0" and "error" in body:
            return None  # the SDK's own header checks (Accept, protocol version)
        return envelope_problem(status, body)
    for message in messages:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return f"not JSON-RPC: {message!r}"[:500]
        result = message.get("result")
        if isinstance(result, dict) and result.get("isError"):
            try:  # the envelope, as the content's text (and perhaps as structured content)
                error = result.get("structuredContent") or json.loads(result["content"][0]["text"])
            except (KeyError, IndexError, TypeError, ValueError):
                error = None
            status = 422 if isinstance(error, dict) and "detail" in error else 400
            if envelope_problem(status, error) is not None:
                return f"tool error without our envelope: {result!r}"[:500]
    return None


class Records(logging.Handler):
    """Every log record written while installed on the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def failures(self) -> list[str]:
        """Records a well-handled request never writes: errors, tracebacks."""
        return [
            f"{r.levelname} {r.name}: {r.getMessage()[:500]}"
            for r in self.records
            if r.levelno >= logging.ERROR or r.exc_info or 'File "' in r.getMessage()
        ]


def log_failures(text: str) -> list[str]:
    """The lines of a server's JSON log a well-handled request never writes."""
    return [
        line[:500]
        for line in text.splitlines()
        if '"level":"error"' in line or "Traceback" in line or 'File \\"' in line
    ]
