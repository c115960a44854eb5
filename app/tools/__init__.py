"""Tools the model may call from the window and ``ferry chat``: MCP servers (``app.tools.mcp``)."""
