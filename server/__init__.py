"""MCP wiring (tools, resources, prompts, transports) and the command line."""

from importlib.metadata import version

__version__ = version("nsightful")  # pyproject.toml's, as installed: the one place it is written
