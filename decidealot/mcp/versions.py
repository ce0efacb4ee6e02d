"""The MCP protocol versions served, and what a request naming another one is told.

2024-11-05 to 2025-11-25 through `initialize`, 2026-07-28 per request (`params._meta`). The SDK
names only the 2026 one in `server/discover` and in its -32022 errors; both transports and
`server/discover` name all five instead (docs/mcp.md).
"""

from __future__ import annotations

from mcp_types import (
    PROTOCOL_VERSION_META_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
    JSONRPCMessage,
    JSONRPCRequest,
    UnsupportedProtocolVersionErrorData,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from decidealot.mcp.strict import JsonRpcRefusal

SERVED_VERSIONS = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)


def modern_version(message: JSONRPCMessage) -> object | None:
    """The version a 2026-07-28 request names in `params._meta`; None for any other message."""
    if not isinstance(message, JSONRPCRequest) or not message.params:
        return None
    meta = message.params.get("_meta")
    if isinstance(meta, dict):
        return meta.get(PROTOCOL_VERSION_META_KEY)
    return None


def unsupported_version(requested: str, request_id: str | int | None) -> JsonRpcRefusal:
    """-32022, naming every version served."""
    data = UnsupportedProtocolVersionErrorData(supported=list(SERVED_VERSIONS), requested=requested)
    return JsonRpcRefusal(
        UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version {requested!r}: this server speaks "
        f"{', '.join(SERVED_VERSIONS)}",
        data.model_dump(mode="json"),
        request_id,
    )
