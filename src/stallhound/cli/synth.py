"""`stallhound synth OUT`: a sample profile with planted problems and their ground truth, or with --ranks a folder
of one export per rank. The arguments are here, so that parsing imports no synth module; what each writes and
prints is synth's own (synth/cli.py and synth/ranks.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from stallhound.cli.arguments import RANK_SET_TRUTH, SYNTH_PRESETS, Subcommands


def register(sub: Subcommands) -> None:
    p = sub.add_parser("synth", help="write a sample profile with planted problems and their ground truth")
    p.add_argument("out", type=Path, help="SQLite file to write; the ground truth goes to OUT.truth.json")
    p.add_argument("--preset", choices=SYNTH_PRESETS, default="demo",
                   help="demo: every problem planted (default); clean: none, GPUs kept busy")
    p.add_argument("--devices", type=int, help="GPUs, one rank process each (default 4)")
    p.add_argument("--iterations", type=int, help="training steps (default 12)")
    p.add_argument("--seed", type=int, help="random seed; the same seed writes the same file (default 0)")
    p.add_argument("--force", action="store_true",
                   help="overwrite OUT even if it is not a sample written by stallhound synth")
    group = p.add_argument_group("rank sets", "with --ranks, OUT is a folder that receives rank_<r>.sqlite per rank "
                                              f"and {RANK_SET_TRUTH}")
    group.add_argument("--ranks", type=int, help="write a rank set of this many ranks (one export each)")
    group.add_argument("--straggler-rank", type=int, help="the rank planted late (default: none, a balanced set)")
    group.add_argument("--straggler-delay-ns", type=int, default=3_000_000,
                       help="how late it arrives at each step's first all-reduce (default 3000000)")
    group.add_argument("--straggler-kind", choices=["compute", "host"], default="compute",
                       help="compute: it computes that much longer (default); host: its GPU idles that long")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from stallhound import synth
    from stallhound.synth import ranks

    return (ranks if args.ranks else synth).run_cli(args)
