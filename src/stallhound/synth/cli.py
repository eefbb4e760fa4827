"""`stallhound synth`: its arguments and what it prints."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import PRESETS
from .writer import truth_path, write_sample


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path,
                        help="SQLite file to write; the ground truth goes to OUT.truth.json")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demo",
                        help="demo: every problem planted (default); clean: none, GPUs kept busy")
    parser.add_argument("--devices", type=int, help="GPUs, one rank process each (default 4)")
    parser.add_argument("--iterations", type=int, help="training steps (default 12)")
    parser.add_argument("--seed", type=int,
                        help="random seed; the same seed writes the same file (default 0)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite OUT even if it is not a sample written by stallhound synth")


def run_cli(args: argparse.Namespace) -> int:
    overrides = {key: getattr(args, key) for key in ("devices", "iterations", "seed")
                 if getattr(args, key) is not None}
    try:
        truth = write_sample(args.out, PRESETS[args.preset](**overrides), force=args.force)
    except (ValueError, OSError) as exc:
        print(f"stallhound synth: {exc}", file=sys.stderr)
        return 2
    size_mb = Path(args.out).stat().st_size / 1e6
    print(f"wrote {args.out} ({size_mb:.1f} MB, preset {args.preset}: devices={len(truth['devices'])}, "
          f"iterations={len(truth['iterations'])}, kernels={truth['totals']['kernels']}, "
          f"planted problems={len(truth['planted'])}) and {truth_path(args.out).name}")
    return 0
