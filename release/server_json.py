"""`python -m release.server_json OUT`: server.json, stallhound's entry in the MCP registry (`mcp-publisher publish
OUT`): the PyPI package run by uvx as `stallhound serve --root FOLDER...` over stdio, and the settings it reads from
its environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from release.meta import DESCRIPTION, NAME, VERSION, mcp_name
from stallhound.model.cache import CACHE_ENV
from stallhound.model.limits import BUILD_MEMORY_ENV, BUILD_MEMORY_MB, MODEL_MEMORY_ENV, MODEL_MEMORY_MB
from stallhound.server.budget import ENV as RESULT_CHARS_ENV
from stallhound.server.budget import MAX_RESULT_CHARS

SCHEMA_URL = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
ENVIRONMENT = {  # what `stallhound serve` reads from its environment; the HTTP token is left out: this runs on stdio
    CACHE_ENV: "folder the models of loaded profiles are kept in (default ~/.cache/stallhound)",
    BUILD_MEMORY_ENV: f"MB a profile's load may hold in memory before it spills to the cache folder "
                      f"(default {BUILD_MEMORY_MB})",
    MODEL_MEMORY_ENV: f"MB each open profile may hold in memory while tools run (default {MODEL_MEMORY_MB})",
    RESULT_CHARS_ENV: f"characters of each tool result, text and structured content each (default {MAX_RESULT_CHARS})",
}
ROOT_ARGUMENT = {"type": "named", "name": "--root", "format": "filepath", "isRequired": True, "isRepeated": True,
                 "description": "absolute path of a folder profiles may be read from (nsys exports, torch.profiler "
                                "traces); repeat for more"}


def server_json() -> dict[str, Any]:
    package = {"registryType": "pypi", "identifier": NAME, "version": VERSION, "runtimeHint": "uvx",
               "transport": {"type": "stdio"},
               "packageArguments": [{"type": "positional", "value": "serve"}, ROOT_ARGUMENT],
               "environmentVariables": [{"name": name, "description": what, "isRequired": False}
                                        for name, what in ENVIRONMENT.items()]}
    return {"$schema": SCHEMA_URL, "name": mcp_name(), "title": NAME, "description": DESCRIPTION, "version": VERSION,
            "packages": [package]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m release.server_json OUT")
    Path(args[0]).write_text(json.dumps(server_json(), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
