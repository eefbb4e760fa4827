"""`stallhound report PROFILE -o report.html` and `stallhound report --diff BEFORE AFTER -o diff.html`."""

from __future__ import annotations

import argparse
from pathlib import Path

from stallhound.cli.arguments import PROFILE_FILES, Subcommands, add_profile_options
from stallhound.model.errors import BadOption, ReportUnwritable


def register(sub: Subcommands) -> None:
    p = sub.add_parser("report", help="draw a profile (or a before/after pair) as one self-contained HTML file")
    p.add_argument("profile", nargs="?", help=f"the profile to draw ({PROFILE_FILES} file)")
    p.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="draw two profiles side by side with "
                                                                          "diff_profiles' verdict instead")
    p.add_argument("-o", "--output", type=Path, required=True, help="the HTML file to write (self-contained: it "
                                                                     "opens offline, nothing is fetched)")
    add_profile_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from stallhound.formats import open_profile
    from stallhound.report import gather, page
    from stallhound.tools import diff_profiles

    if (args.profile is None) == (args.diff is None):
        raise BadOption("give one profile, or --diff BEFORE AFTER, not both; e.g. stallhound report run.sqlite "
                             "-o report.html")
    if args.output.is_dir():
        raise BadOption(f"-o {args.output} is a folder; name the HTML file to write, e.g. -o report.html")
    paths = args.diff or [args.profile]
    opened = []
    try:
        for path in paths:
            opened.append(open_profile(path, cache_dir=args.cache_dir, use_cache=not args.no_cache))
        sides = [gather.gather(p.con, Path(path).name, str(p.path)) for p, path in zip(opened, paths, strict=True)]
        if args.diff:
            params = diff_profiles.Params(before=sides[0].label, after=sides[1].label)
            html = page.diff_report(sides[0], sides[1], diff_profiles.run(opened[0].con, opened[1].con, params))
        else:
            html = page.report(sides[0])
    finally:
        for p in opened:
            p.close()
    try:
        args.output.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise ReportUnwritable(f"cannot write {args.output} ({exc.strerror}); pick a writable path with -o") from exc
    print(f"wrote {args.output} ({len(html.encode()) / 1e6:.2f} MB)")
    return 0
