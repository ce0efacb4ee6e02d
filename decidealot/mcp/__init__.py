"""Decidealot's MCP server: the HTTP API's operations as tools (`tools`, `server`), over
streamable HTTP at `/mcp` (`http`) and stdio (`stdio`, `decidealot mcp`)."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """`decidealot mcp`; imported lazily so that `decidealot serve` does not load stdio."""
    from decidealot.mcp.stdio import main as serve_stdio

    return serve_stdio(argv)
