"""MCP servers' tools for the app, Qt-free: ``config`` (mcp.json), ``session`` (one
server), ``hub`` (all of them on their own asyncio thread), ``events`` (what they report),
``toolset`` (what one chat lets the model call)."""
