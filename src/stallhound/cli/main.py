"""The `stallhound` command: serve over MCP, run any tool from the shell, triage, make samples."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from stallhound import __version__
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.model import allocator
from stallhound.model.errors import StallhoundError
from stallhound.model.limits import model_memory
from stallhound.server import budget
from stallhound.server.http import TOKEN_ENV
from stallhound.server.store import DEFAULT_MEMORY_BUDGET_MB
from stallhound.server.validation import explain, unknown_arguments

EXIT_USAGE = 2
EXIT_REGRESSED = 1  # `diff --fail-on-regression`: a CI job fails on it


def _add_profile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", type=Path, help="where built models are kept (default: $STALLHOUND_CACHE_DIR "
                                                  "or $XDG_CACHE_HOME/stallhound)")
    p.add_argument("--no-cache", action="store_true", help="build the model in a temporary folder, keep nothing")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="stallhound", description="Read NVIDIA Nsight Systems profiles, for people "
                                                               "and AI assistants (MCP).")
    ap.add_argument("--version", action="version", version=f"stallhound {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

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
    serve.add_argument("--root", action="append", type=Path, default=[],
                       help="folder profiles may be read from (repeatable; default: the working directory)")
    serve.add_argument("--max-result-chars", type=int, metavar="N",
                       help="character budget of each tool result, text and structured content each (default: "
                            "$STALLHOUND_MAX_RESULT_CHARS or 20000); sets STALLHOUND_MAX_RESULT_CHARS")
    _add_profile_options(serve)

    tool = sub.add_parser("tool", help="run one analysis tool on a profile")
    tool.add_argument("name", help="tool name, e.g. gpu_idle_gaps (see `stallhound tools`)")
    tool.add_argument("profile", help="path of an nsys .sqlite/.nsys-rep export or a torch.profiler .json/.json.gz "
                                      "trace")
    tool.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                      help="a tool parameter, e.g. -p device=0 -p min_gap_ns=2000000")
    tool.add_argument("--json", action="store_true", help="print the structured result as JSON")
    _add_profile_options(tool)

    sub.add_parser("tools", help="list the tools and what each answers")

    triage = sub.add_parser("triage", help="rank the problems in a profile, with root causes and fixes")
    triage.add_argument("profile")
    fmt = triage.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="structured result as JSON")
    fmt.add_argument("--markdown", action="store_true", help="markdown, for a pull request or issue")
    _add_profile_options(triage)

    diff = sub.add_parser("diff", help="did a change make it faster? compare two profiles, with a verdict")
    diff.add_argument("before", help="profile captured before the change")
    diff.add_argument("after", help="profile captured after the change")
    diff.add_argument("--format", choices=["text", "markdown", "json"], default="text",
                      help="text (default), markdown for a pull request, or the structured result as JSON")
    diff.add_argument("--limit", type=int, metavar="N", help="most kernel rows shown (default 10)")
    diff.add_argument("--fail-on-regression", type=float, metavar="PCT",
                      help=f"exit with status {EXIT_REGRESSED} when the verdict is 'regressed' by more than PCT "
                           "(% of the step time; points of GPU idle share when a side has no steady iterations)")
    _add_profile_options(diff)

    from stallhound.cli.job import add_job_parsers
    add_job_parsers(sub)

    report = sub.add_parser("report", help="draw a profile (or a before/after pair) as one self-contained HTML file")
    from stallhound.cli import report as report_cli
    report_cli.add_arguments(report)
    _add_profile_options(report)

    synth = sub.add_parser("synth", help="write a sample profile with planted problems and their ground truth")
    from stallhound import synth as synth_module
    synth_module.add_arguments(synth)
    from stallhound.synth import ranks as synth_ranks
    synth_ranks.add_arguments(synth)
    return ap


def _parse_params(module, profile: str, pairs: list[str], as_field: str = "profile", **fixed: str):
    """The tool's Params from -p KEY=VALUE strings, parsed as the types say ("0" is device 0, "true" a bool);
    the profile goes in as `as_field`, with `fixed` values beside it (diff's `after`)."""
    values: dict[str, str] = {as_field: profile, **fixed}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise StallhoundError(f"--param {pair!r} is not KEY=VALUE; e.g. -p device=0")
        values[key] = value
    valid = [k for k in module.Params.model_fields if k != as_field and k not in fixed]
    unknown = [k for k in values if k not in module.Params.model_fields]
    if unknown:
        raise StallhoundError(unknown_arguments(unknown, valid))
    try:
        return module.Params.model_validate_strings(values)
    except ValidationError as exc:
        raise StallhoundError(explain(exc, module.Params.model_json_schema())) from exc


def _skill(name: str):
    from importlib import import_module

    from stallhound.tools import TOOL_NAMES
    if name not in TOOL_NAMES:
        raise StallhoundError(f"there is no tool {name!r} (tools: {', '.join(TOOL_NAMES)})")
    return import_module(f"stallhound.tools.{name}")


def _run_tool(args, name: str, pairs: list[str]):
    """(module, text, result): cut to STALLHOUND_MAX_RESULT_CHARS only when it is set (see budget)."""
    module = _skill(name)
    params = _parse_params(module, args.profile, pairs)
    profile = open_profile(args.profile, cache_dir=args.cache_dir, use_cache=not args.no_cache)
    try:
        with model_memory():
            return module, *budget.fit(run_skill(profile.con, module, params), module, params, budget.configured())
    finally:
        profile.close()


def cmd_tool(args) -> int:
    _, text, result = _run_tool(args, args.name, args.param)
    print(result.model_dump_json(indent=2) if args.json else text)
    return 0


def cmd_tools(_args) -> int:
    from stallhound.cli.docs import tool_summaries
    for name, line in tool_summaries():
        print(f"{name:24} {line}")
    return 0


def cmd_triage(args) -> int:
    module, text, result = _run_tool(args, "triage", [])
    if args.json:
        print(result.model_dump_json(indent=2))
    elif args.markdown:
        print(module.render_markdown(result))
    else:
        print(text)
    return 0


def cmd_diff(args) -> int:
    from stallhound.tools import diff_profiles
    pairs = [] if args.limit is None else [f"limit={args.limit}"]
    params = _parse_params(diff_profiles, args.before, pairs, as_field="before", after=args.after)
    if args.fail_on_regression is not None and args.fail_on_regression < 0:
        raise StallhoundError(f"--fail-on-regression {args.fail_on_regression:g} is negative; pass a percentage "
                             "of 0 or more")
    before = open_profile(args.before, cache_dir=args.cache_dir, use_cache=not args.no_cache)
    try:
        after = open_profile(args.after, cache_dir=args.cache_dir, use_cache=not args.no_cache)
        try:
            text, result = budget.fit(diff_profiles.run(before.con, after.con, params), diff_profiles, params,
                                      budget.configured())
        finally:
            after.close()
    finally:
        before.close()
    print({"json": lambda: result.model_dump_json(indent=2), "markdown": lambda: diff_profiles.render_markdown(result),
           "text": lambda: text}[args.format]())
    d = result.decision
    regressed = d.verdict == "regressed" and d.change_pct is not None and d.change_pct > (args.fail_on_regression or 0)
    return EXIT_REGRESSED if args.fail_on_regression is not None and regressed else 0


def cmd_serve(args) -> int:
    from stallhound.server.app import build_server
    from stallhound.server.http import check_bind, transport_security
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    roots = args.root or [Path.cwd()]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        raise StallhoundError(f"--root {', '.join(missing)} is not a folder; pass existing folders")
    if args.memory_budget_mb <= 0:
        raise StallhoundError(f"--memory-budget-mb {args.memory_budget_mb} is not positive; pass a size in MB")
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


def main(argv: list[str] | None = None) -> int:
    from stallhound.cli.job import cmd_build, cmd_job_tool
    args = parser().parse_args(argv)
    allocator.tune()
    from stallhound.cli import report as report_cli
    commands = {"serve": cmd_serve, "tool": cmd_tool, "tools": cmd_tools, "triage": cmd_triage,
                "diff": cmd_diff, "build": cmd_build, "report": report_cli.run}
    try:
        if args.command == "synth":
            from stallhound import synth
            from stallhound.synth import ranks as synth_ranks
            return (synth_ranks if args.ranks else synth).run_cli(args)
        if getattr(args, "job_tool", None):
            return cmd_job_tool(args)
        return commands[args.command](args)
    except StallhoundError as exc:
        print(f"stallhound: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stallhound: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `stallhound ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
