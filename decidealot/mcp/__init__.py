"""The MCP server: the HTTP API's operations as tools (`tools`, `server`), over `/mcp` and stdio."""
