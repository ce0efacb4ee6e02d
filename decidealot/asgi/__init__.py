"""What both HTTP faces (REST and `/mcp`) share: the gateway middleware, bodies, disconnects."""
