"""`stallhound synth OUT`: a sample profile with planted problems and their ground truth, or with --ranks a folder
of one export per rank (the arguments and what each prints are synth's own: synth/cli.py and synth/ranks.py)."""

from __future__ import annotations

import argparse

from stallhound import synth
from stallhound.cli.arguments import Subcommands
from stallhound.synth import ranks


def register(sub: Subcommands) -> None:
    p = sub.add_parser("synth", help="write a sample profile with planted problems and their ground truth")
    synth.add_arguments(p)
    ranks.add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return (ranks if args.ranks else synth).run_cli(args)
