"""MCP wiring: the tools, resources, prompts and transports of the server."""

from stallhound import __version__

__all__ = ["__version__"]
