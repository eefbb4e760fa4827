"""`stallhound diff BEFORE AFTER`: did a change make it faster, with a verdict a CI job can fail on."""

from __future__ import annotations

import argparse

from stallhound.cli.arguments import Subcommands, add_profile_options
from stallhound.model.errors import BadOption

EXIT_REGRESSED = 1  # `diff --fail-on-regression`: a CI job fails on it


def register(sub: Subcommands) -> None:
    diff = sub.add_parser("diff", help="did a change make it faster? compare two profiles, with a verdict")
    diff.add_argument("before", help="profile captured before the change")
    diff.add_argument("after", help="profile captured after the change")
    diff.add_argument("--format", choices=["text", "markdown", "json"], default="text",
                      help="text (default), markdown for a pull request, or the structured result as JSON")
    diff.add_argument("--limit", type=int, metavar="N", help="most kernel rows shown (default 10)")
    diff.add_argument("--fail-on-regression", type=float, metavar="PCT",
                      help=f"exit with status {EXIT_REGRESSED} when the verdict is 'regressed' by more than PCT: "
                           "%% of the figure that decided it (the step time, or the GPU-active span, kernel time or "
                           "host time of the same work), points of GPU idle share when the runs did different work "
                           "without steady iterations")
    add_profile_options(diff)
    diff.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from stallhound.cli.calls import parse_params, print_fitted
    from stallhound.formats import open_profile
    from stallhound.tools import diff_profiles

    pairs = [] if args.limit is None else [f"limit={args.limit}"]
    params = parse_params(diff_profiles, args.before, pairs, as_field="before", after=args.after)
    assert isinstance(params, diff_profiles.Params)  # parse_params builds the module's Params
    if args.fail_on_regression is not None and args.fail_on_regression < 0:
        raise BadOption(f"--fail-on-regression {args.fail_on_regression:g} is negative; pass a percentage "
                             "of 0 or more")
    before = open_profile(args.before, cache_dir=args.cache_dir, use_cache=not args.no_cache)
    try:
        after = open_profile(args.after, cache_dir=args.cache_dir, use_cache=not args.no_cache)
        try:
            result = print_fitted(diff_profiles.run(before.con, after.con, params), diff_profiles, params, args.format)
        finally:
            after.close()
    finally:
        before.close()
    assert isinstance(result, diff_profiles.Result)  # fit keeps the module's Result
    d = result.decision
    regressed = d.verdict == "regressed" and d.change_pct is not None and d.change_pct > (args.fail_on_regression or 0)
    return EXIT_REGRESSED if args.fail_on_regression is not None and regressed else 0
