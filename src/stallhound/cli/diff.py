"""`stallhound diff BEFORE AFTER`: did a change make it faster, with a verdict a CI job can fail on; and
`stallhound verify-fix BEFORE AFTER ROOT_CAUSE`: did the fix for that root cause work."""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import TYPE_CHECKING

from stallhound.cli.arguments import Subcommands, add_profile_options, add_range_name, range_name_pairs
from stallhound.model.errors import BadOption

if TYPE_CHECKING:
    from pydantic import BaseModel

EXIT_REGRESSED = 1  # `diff --fail-on-regression`: a CI job fails on it
EXIT_FIX_FAILED = 1  # `verify-fix`: the fix did not work (answer 'fail')


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
    add_range_name(diff)
    add_profile_options(diff)
    diff.set_defaults(run=run)

    verify = sub.add_parser("verify-fix", help="did the fix for a root cause work? its book entry's verify step on "
                                               "two profiles")
    verify.add_argument("before", help="profile captured before the fix")
    verify.add_argument("after", help="profile captured after the fix")
    verify.add_argument("root_cause", help="the root cause whose fix to verify, e.g. gpu-bubbles (a triage "
                                           "finding's root cause)")
    verify.add_argument("--format", choices=["text", "json"], default="text",
                        help="text (default) or the structured result as JSON")
    add_range_name(verify)
    add_profile_options(verify)
    verify.set_defaults(run=run_verify)


def _compared(module: ModuleType, params: BaseModel, args: argparse.Namespace) -> BaseModel:
    """The pair tool's result on the two profiles, printed as args.format asks."""
    from stallhound.cli.calls import print_fitted
    from stallhound.formats import open_profile

    before = open_profile(args.before, cache_dir=args.cache_dir, use_cache=not args.no_cache)
    try:
        after = open_profile(args.after, cache_dir=args.cache_dir, use_cache=not args.no_cache)
        try:
            return print_fitted(module.run(before.con, after.con, params), module, params, args.format)
        finally:
            after.close()
    finally:
        before.close()


def run(args: argparse.Namespace) -> int:
    from stallhound.cli import memo  # at run time: parsing stays light (cli/main.py)

    if args.fail_on_regression is not None and args.fail_on_regression < 0:
        raise BadOption(f"--fail-on-regression {args.fail_on_regression:g} is negative; pass a percentage "
                             "of 0 or more")
    call = ["diff", args.format, args.limit, args.range_name, args.fail_on_regression]
    kept = None if args.no_cache else memo.find(args.cache_dir, [args.before, args.after], call)
    return memo.answered(kept, lambda: _diffed(args))


def _diffed(args: argparse.Namespace) -> int:
    from stallhound.cli.calls import parse_params
    from stallhound.tools import diff_profiles

    pairs = ([] if args.limit is None else [f"limit={args.limit}"]) + range_name_pairs(args)
    params = parse_params(diff_profiles, args.before, pairs, as_field="before", after=args.after)
    assert isinstance(params, diff_profiles.Params)  # parse_params builds the module's Params
    result = _compared(diff_profiles, params, args)
    assert isinstance(result, diff_profiles.Result)  # fit keeps the module's Result
    d = result.decision
    regressed = d.verdict == "regressed" and d.change_pct is not None and d.change_pct > (args.fail_on_regression or 0)
    return EXIT_REGRESSED if args.fail_on_regression is not None and regressed else 0


def run_verify(args: argparse.Namespace) -> int:
    from stallhound.cli.calls import parse_params
    from stallhound.tools import verify_fix

    params = parse_params(verify_fix, args.before, [f"root_cause={args.root_cause}", *range_name_pairs(args)],
                          as_field="before", after=args.after)
    result = _compared(verify_fix, params, args)
    assert isinstance(result, verify_fix.Result)  # fit keeps the module's Result
    return EXIT_FIX_FAILED if result.answer == "fail" else 0
