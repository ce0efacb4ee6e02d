"""Decidealot's MCP server: the HTTP API's operations as tools (`tools`, `server`), over
streamable HTTP at `/mcp` (`http`) and stdio (`stdio`, `decidealot mcp`)."""
