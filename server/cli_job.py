"""`nsightful build`: load every rank of a job into the cache (models and Parquet), here or on a Dask cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from nsightful.profiles import job_dask
from nsightful.profiles.errors import NsightfulError
from nsightful.profiles.job import load_job


def add_build_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    build = sub.add_parser("build", help="build every rank of a job (models and Parquet) into the cache, in "
                                         "parallel or on a Dask cluster")
    build.add_argument("paths", nargs="+", help="the ranks' profiles: paths, their folder or a glob")
    build.add_argument("--workers", type=int, metavar="N", help="processes building at once (default: this "
                                                                 "machine's cores)")
    where = build.add_mutually_exclusive_group()
    where.add_argument("--dask-scheduler", metavar="ADDRESS",
                       help=f"build on this Dask cluster (default: ${job_dask.SCHEDULER_ENV} when set); its workers "
                            "must read the profiles and the cache folder at the same paths")
    where.add_argument("--dask-scheduler-file", type=Path, metavar="FILE", help="the Dask scheduler described by "
                                                                                 "this scheduler file")
    build.add_argument("--cache-dir", type=Path, help="where built models and Parquet are kept (default: "
                                                      "$NSIGHTFUL_CACHE_DIR or $XDG_CACHE_HOME/nsightful)")
    return build


def cmd_build(args) -> int:
    from nsightful.server.job_tools import describe
    if args.workers is not None and args.workers < 1:
        raise NsightfulError(f"--workers {args.workers} is not positive; pass 1 or more processes")
    address, scheduler_file = job_dask.scheduler_from(args.dask_scheduler, args.dask_scheduler_file)
    client = job_dask.connect(address, scheduler_file) if address or scheduler_file else None
    try:
        job = load_job(args.paths, cache_dir=args.cache_dir, workers=args.workers, dask_client=client)
    finally:
        if client is not None:
            client.close()
    try:
        text, _ = describe(job.key[:12], job)
        print(f"{text}\nParquet: {job.folder}")
    finally:
        job.close()
    return 0
