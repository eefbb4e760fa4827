"""A job: every rank of one distributed run, from one profile per rank (or one profile of several processes or
devices), as one DuckDB connection over each rank's model written as Parquet.

Loading a job builds each file's model (cached like any profile) in parallel, says which rank each part is and how
that was found (jobs.ranks), writes each rank's tables as Parquet into the cache folder, and opens views
over them (jobs.parquet). The Parquet of a job is cached too, keyed by its ranks' contents.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from stallhound.formats.registry import converted_suffixes
from stallhound.jobs import parquet as job_parquet
from stallhound.jobs.build import Runner, build_file, cores, runner
from stallhound.jobs.files import job_files
from stallhound.jobs.ranks import Probe, RankSpec, assign
from stallhound.model import cache
from stallhound.model.cache import Progress
from stallhound.model.schema import MODEL_VERSION

JOB_FORMAT = 1  # bump when the Parquet layout changes: cached jobs are written anew
JOBS_FOLDER = "jobs"  # under the cache folder: one folder of Parquet per job
# A temporary folder of a job older than this is a killed load's: writing a job takes minutes, not a day.
STALE_WRITE_S = 24 * 3600


@dataclass(frozen=True)
class Timings:
    """Where a load's time went: the workers' seconds summed over files (build or cache reuse) and ranks (Parquet
    write), and the load's own wall time."""

    build_s: float
    write_s: float
    wall_s: float
    reused: bool  # the job's Parquet was in the cache already: nothing was written


@dataclass
class Job:
    key: str
    folder: Path  # the job's Parquet: <table>/rank=<r>/<fingerprint>.parquet
    ranks: list[RankSpec]
    timings: Timings
    con: duckdb.DuckDBPyConnection = field(repr=False)

    def close(self) -> None:
        self.con.close()


def job_key(specs: list[RankSpec]) -> str:
    digest = hashlib.blake2b(f"job{JOB_FORMAT}-model{MODEL_VERSION}".encode(), digest_size=16)
    for s in specs:
        digest.update(f"|{s.rank},{s.rank_source},{s.fingerprint},{s.unit.kind},{s.unit.value},{s.path}".encode())
    return digest.hexdigest()


class _Reporter:
    """Progress across both phases: a step per file built, then a step per rank written."""

    def __init__(self, progress: Progress | None, files: int):
        self.progress, self.done, self.total = progress, 0, 2 * files  # ranks are known after the builds

    def step(self, label: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total, label)


def _build_all(run: Runner, files: list[Path], directory: Path, report: _Reporter) -> list[Probe]:
    probes: list[Probe | None] = [None] * len(files)

    def done(i: int, found: Probe) -> None:
        probes[i] = found
        report.step(f"built {files[i].name} ({sum(p is not None for p in probes)} of {len(files)} files)")

    run.run(build_file, [(f, directory) for f in files], done)
    return [p for p in probes if p is not None]


def _write_all(run: Runner, specs: list[RankSpec], folder: Path, threads: int, report: _Reporter) -> float:
    seconds: list[float] = []

    def done(i: int, took: float) -> None:
        seconds.append(took)
        report.step(f"rank {specs[i].rank} written as Parquet ({len(seconds)} of {len(specs)} ranks)")

    run.run(job_parquet.write_rank, [(s, folder, threads) for s in specs], done)
    return sum(seconds)


def _all_cached(files: list[Path], directory: Path) -> bool:
    """Whether every file's model is in the cache already: reopening them here is quicker than starting a pool
    (spawning its processes takes about two seconds)."""
    return all(f.suffix.lower() not in converted_suffixes()
               and cache.model_path(directory, cache.fingerprint(f)).exists() for f in files)


def _jobs_dir(directory: Path) -> Path:
    jobs = directory / JOBS_FOLDER
    try:
        jobs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cache.unwritable(directory, exc) from exc
    return jobs


def _write_job(run: Runner, specs: list[RankSpec], final: Path, threads: int, report: _Reporter) -> float:
    """Write every rank into a temporary folder beside `final`, then rename it into place (a load killed half way
    leaves only its temporary folder; two loads of one job write twice and the first rename wins)."""
    for old in final.parent.glob(f".{final.name}-*"):
        with suppress(OSError):  # removed meanwhile by another load of this job
            if time.time() - old.stat().st_mtime > STALE_WRITE_S:
                shutil.rmtree(old, ignore_errors=True)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as exc:
        raise cache.unwritable(final.parent, exc) from exc
    try:
        seconds = _write_all(run, specs, tmp, threads, report)
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
        return seconds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_job(spec: str | Path | Sequence[str | Path], *, cache_dir: Path | None = None, workers: int | None = None,
             progress: Progress | None = None, check: Callable[[Path], Path] = Path.resolve, dask_client: Any = None,
             cancelled: threading.Event | None = None) -> Job:
    """The job made of the profiles `spec` names (paths, a folder or a glob; see job_files): models built with
    `workers` processes (at most, and by default, this machine's cores; one job's pool at a time, see jobs.build), or
    as tasks on a Dask cluster through `dask_client`. `check` resolves each path (the server's allowed roots); setting
    `cancelled` stops the load."""
    start = time.perf_counter()
    files = job_files(spec, check)
    directory = cache_dir or cache.cache_dir()
    # More processes than cores win no time and each holds up to a build's memory: 64 asked for 32 ranks took 5.45 GB.
    workers, cancelled = min(workers or cores(), cores()), cancelled or threading.Event()
    report = _Reporter(progress, len(files))
    cached = dask_client is None and _all_cached(files, directory)
    run = runner(1 if cached else workers, len(files), cancelled, dask_client)
    try:
        probes = _build_all(run, files, directory, report)
        specs = assign(probes)
        report.total = len(files) + len(specs)
        folder = _jobs_dir(directory) / job_key(specs)
        reused = folder.is_dir()
        if not reused and cached:  # the models were only reopened here; the writes may still use a pool
            run = runner(workers, len(specs), cancelled, None)
        write_s = 0.0 if reused else _write_job(run, specs, folder, max(1, cores() // workers), report)
    finally:
        run.close()
    timings = Timings(sum(p.build_s for p in probes), write_s, time.perf_counter() - start, reused)
    return Job(folder.name, folder, specs, timings, job_parquet.connect(folder, specs))
