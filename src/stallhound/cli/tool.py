"""`stallhound tool NAME PROFILE`, `stallhound tools` and `stallhound triage PROFILE`: the tools on one profile."""

from __future__ import annotations

import argparse

from stallhound.cli.arguments import PROFILE_FILES, Subcommands, add_profile_options, add_range_name, range_name_pairs

UNKEPT_TOOLS = {"query_sql"}  # the user's SQL may ask for now() or random(): not a pure function of the model


def register(sub: Subcommands) -> None:
    tool = sub.add_parser("tool", help="run one analysis tool on a profile")
    tool.add_argument("name", help="tool name, e.g. gpu_idle_gaps (see `stallhound tools`)")
    tool.add_argument("profile", help=f"path of a profile: {PROFILE_FILES} file")
    tool.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                      help="a tool parameter, e.g. -p device=0 -p min_gap_ns=2000000")
    tool.add_argument("--json", action="store_true", help="print the structured result as JSON")
    add_profile_options(tool)
    tool.set_defaults(run=run_tool)

    sub.add_parser("tools", help="list the tools and what each answers").set_defaults(run=list_tools)

    triage = sub.add_parser("triage", help="rank the problems in a profile, with root causes and fixes")
    triage.add_argument("profile")
    fmt = triage.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="structured result as JSON")
    fmt.add_argument("--markdown", action="store_true", help="markdown, for a pull request or issue")
    add_range_name(triage)
    add_profile_options(triage)
    triage.set_defaults(run=run_triage)


def _run(args: argparse.Namespace, name: str, pairs: list[str], form: str) -> int:
    """Run the tool `name` on the profile and print its result as `form` (see print_fitted), or print the answer
    kept from the same call on the same model (cli/memo.py)."""
    from stallhound.cli import memo  # at run time: parsing stays light (cli/main.py)

    pure = not args.no_cache and name not in UNKEPT_TOOLS
    kept = memo.find(args.cache_dir, [args.profile], ["tool", name, form, *pairs]) if pure else None
    return memo.answered(kept, lambda: _computed(args, name, pairs, form))


def _computed(args: argparse.Namespace, name: str, pairs: list[str], form: str) -> int:
    from stallhound import tools
    from stallhound.analysis.contracts import run_skill
    from stallhound.cli.calls import parse_params, print_fitted
    from stallhound.formats import open_profile
    from stallhound.model.limits import model_memory

    module = tools.skill(name)
    params = parse_params(module, args.profile, pairs)
    profile = open_profile(args.profile, cache_dir=args.cache_dir, use_cache=not args.no_cache)
    try:
        with model_memory():
            print_fitted(run_skill(profile.con, module, params), module, params, form)
    finally:
        profile.close()
    return 0


def run_tool(args: argparse.Namespace) -> int:
    return _run(args, args.name, args.param, "json" if args.json else "text")


def list_tools(_args: argparse.Namespace) -> int:
    from stallhound.cli.docs import tool_summaries

    for name, line in tool_summaries():
        print(f"{name:24} {line}")
    return 0


def run_triage(args: argparse.Namespace) -> int:
    form = "json" if args.json else "markdown" if args.markdown else "text"
    return _run(args, "triage", range_name_pairs(args), form)

