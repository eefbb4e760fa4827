"""MCP wiring: the tools, resources, prompts and transports of the server."""
