"""`stallhound build`: load every rank of a job into the cache (models and Parquet), here or on a Dask cluster; and a
command per job tool (`stallhound rank-imbalance PATHS...` for rank_imbalance), which loads the job and runs it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallhound.cli.arguments import DASK_SCHEDULER_ENV, JOB_TOOLS, Subcommands
from stallhound.model.errors import BadOption

if TYPE_CHECKING:
    from stallhound.jobs.job import Job

CLI_JOB_ID = "job"  # what a job tool's `job` parameter holds on the command line, where one job is loaded


def _add_job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", help="the ranks' profiles: paths, their folder or a glob")
    p.add_argument("--workers", type=int, metavar="N", help="processes building at once (default: this machine's "
                                                             "cores)")
    p.add_argument("--cache-dir", type=Path, help="where built models and Parquet are kept (default: "
                                                  "$STALLHOUND_CACHE_DIR or $XDG_CACHE_HOME/stallhound)")


def command_of(tool: str) -> str:
    return tool.replace("_", "-")


def register(sub: Subcommands) -> None:
    """`build`, and a command per job tool."""
    build = sub.add_parser("build", help="build every rank of a job (models and Parquet) into the cache, in "
                                         "parallel or on a Dask cluster")
    _add_job_options(build)
    build.set_defaults(run=run_build)
    where = build.add_mutually_exclusive_group()
    where.add_argument("--dask-scheduler", metavar="ADDRESS",
                       help=f"build on this Dask cluster (default: ${DASK_SCHEDULER_ENV} when set); its workers "
                            "must read the profiles and the cache folder at the same paths")
    where.add_argument("--dask-scheduler-file", type=Path, metavar="FILE", help="the Dask scheduler described by "
                                                                                 "this scheduler file")
    for name, summary in JOB_TOOLS.items():
        p = sub.add_parser(command_of(name), help=summary)
        _add_job_options(p)
        p.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                       help="a tool parameter, e.g. -p limit=5")
        p.add_argument("--json", action="store_true", help="print the structured result as JSON")
        p.set_defaults(run=run_job_tool, job_tool=name)


def _load(args: argparse.Namespace, client: Any = None) -> Job:
    from stallhound.jobs.job import load_job

    if args.workers is not None and args.workers < 1:
        raise BadOption(f"--workers {args.workers} is not positive; pass 1 or more processes")
    return load_job(args.paths, cache_dir=args.cache_dir, workers=args.workers, dask_client=client)


def run_build(args: argparse.Namespace) -> int:
    from stallhound.jobs import dask as job_dask
    from stallhound.server.job_tools import describe

    address, scheduler_file = job_dask.scheduler_from(args.dask_scheduler, args.dask_scheduler_file)
    client = job_dask.connect(address, scheduler_file) if address or scheduler_file else None
    try:
        job = _load(args, client)
    finally:
        if client is not None:
            client.close()
    try:
        text, _ = describe(job.key[:12], job)
        print(f"{text}\nParquet: {job.folder}")
    finally:
        job.close()
    return 0


def run_job_tool(args: argparse.Namespace) -> int:
    """Load the job, then run one job tool on it (cut to STALLHOUND_MAX_RESULT_CHARS only when that is set)."""
    from stallhound import tools
    from stallhound.analysis.contracts import run_skill
    from stallhound.cli.calls import parse_params, print_fitted

    module = tools.job_tools()[args.job_tool]
    params = parse_params(module, CLI_JOB_ID, args.param, as_field="job")  # a bad -p fails before the build
    job = _load(args)
    try:
        print_fitted(run_skill(job.con, module, params), module, params, "json" if args.json else "text")
    finally:
        job.close()
    return 0
