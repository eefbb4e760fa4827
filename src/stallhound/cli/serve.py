"""`stallhound serve`: the MCP server over stdio or HTTP."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from stallhound.cli.arguments import DEFAULT_MEMORY_BUDGET_MB, TOKEN_ENV, Subcommands, add_profile_options
from stallhound.model.errors import BadOption


def register(sub: Subcommands) -> None:
    serve = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1); any other "
                                                            "address needs a bearer token")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    serve.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                       help=f"bearer token every HTTP request must carry (default: ${TOKEN_ENV}, which keeps it "
                            "out of the process list)")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="Host name clients use to reach the server besides the bind address (repeatable; "
                            "requests naming any other host are refused, against DNS rebinding)")
    serve.add_argument("--memory-budget-mb", type=int, default=DEFAULT_MEMORY_BUDGET_MB,
                       help="size of the open profile models kept in memory; past it the least recently used "
                            f"one is closed and reopens from the cache when next used (default "
                            f"{DEFAULT_MEMORY_BUDGET_MB})")
    serve.add_argument("--root", action="extend", nargs="+", type=Path, default=[], metavar="FOLDER",
                       help="folders profiles may be read from (repeatable, or several after one --root, as an "
                            "MCP bundle's folder list expands; default: the working directory)")
    serve.add_argument("--max-result-chars", type=int, metavar="N",
                       help="character budget of each tool result, text and structured content each (default: "
                            "$STALLHOUND_MAX_RESULT_CHARS or 20000); sets STALLHOUND_MAX_RESULT_CHARS")
    add_profile_options(serve)
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from stallhound.server import budget
    from stallhound.server.app import build_server
    from stallhound.server.http import check_bind, transport_security

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    roots = args.root or [Path.cwd()]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        raise BadOption(f"--root {', '.join(missing)} is not a folder; pass existing folders")
    if args.memory_budget_mb <= 0:
        raise BadOption(f"--memory-budget-mb {args.memory_budget_mb} is not positive; pass a size in MB")
    if args.max_result_chars is not None:
        os.environ[budget.ENV] = str(args.max_result_chars)
    budget.configured()  # a bad setting stops the server here, not at every call
    http = args.transport == "http"
    if http:
        check_bind(args.host, args.token)
    mcp = build_server(roots, cache_dir=args.cache_dir, use_cache=not args.no_cache,
                       memory_budget_mb=args.memory_budget_mb, token=args.token if http else None)
    if http:
        mcp.run("streamable-http", host=args.host, port=args.port,
                transport_security=transport_security(args.host, args.allowed_host))
    else:
        mcp.run("stdio")
    return 0
