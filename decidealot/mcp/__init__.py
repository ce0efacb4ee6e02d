"""Decidealot's MCP server: the HTTP API's operations as tools, over stdio and streamable HTTP.

`tools` states what clients see, `server` answers tool calls through a `Backend` (this
process's service, or `forward` to a running Decidealot), `http` mounts it at `/mcp`, and
`stdio` is `decidealot mcp`.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """`decidealot mcp`; imported lazily so that `decidealot serve` does not load stdio."""
    from decidealot.mcp.stdio import main as serve_stdio

    return serve_stdio(argv)
