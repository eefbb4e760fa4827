"""What the subcommands' parsers share: the subparsers they register on, the profile cache options, and the names
their help texts give. Parsing imports nothing that reads a profile (cli/main.py says why); what the help texts
name from the layers below is written out here, and tests/test_cli_start.py checks each against its source."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol

# server.wording's writers() and profile_files(), from the formats registry
WRITERS = "nsys or torch.profiler"
PROFILE_FILES = "nsys .sqlite/.nsys-rep/.qdrep or torch.profiler .json/.json.gz"
TOKEN_ENV = "STALLHOUND_TOKEN"  # server.http's
DEFAULT_MEMORY_BUDGET_MB = 4096  # server.store's
DASK_SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"  # jobs.dask's SCHEDULER_ENV
SYNTH_PRESETS = ("clean", "demo")  # synth.PRESETS' names, sorted
RANK_SET_TRUTH = "job.truth.json"  # synth.ranks.TRUTH_NAME
# tools.JOB_TOOL_NAMES with the first line of each module's docstring: a command each (cli/job.py)
JOB_TOOLS = {
    "rank_imbalance": "Which rank of a job is slow, and why: per-rank GPU time, step times, waits inside collectives, "
                      "the straggler.",
    "triage_job": "Why is this job slow? The cross-rank findings and the triage of the rank that matters, ranked by "
                  "time at stake.",
}


class Subcommands(Protocol):
    """argparse's subparsers, where each subcommand module's `register` adds its parser."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_profile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", type=Path, help="where built models are kept (default: $STALLHOUND_CACHE_DIR "
                                                  "or $XDG_CACHE_HOME/stallhound)")
    p.add_argument("--no-cache", action="store_true", help="build the model in a temporary folder, keep nothing")


def add_range_name(p: argparse.ArgumentParser) -> None:
    p.add_argument("--range-name", metavar="NAME", help="the NVTX or record_function range that marks one step, e.g. "
                                                        "train_step (letters compared, case and numbers ignored); "
                                                        "default: the steps found automatically")


def range_name_pairs(args: argparse.Namespace) -> list[str]:
    """--range-name as the KEY=VALUE pairs parse_params reads."""
    return [] if args.range_name is None else [f"range_name={args.range_name}"]
