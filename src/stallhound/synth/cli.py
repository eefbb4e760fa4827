"""`stallhound synth`: what it writes and prints (its arguments are cli/synth.py's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import PRESETS
from .writer import truth_path, write_sample


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
