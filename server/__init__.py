"""MCP wiring (tools, resources, prompts, transports) and the command line."""

__version__ = "0.1.0"
