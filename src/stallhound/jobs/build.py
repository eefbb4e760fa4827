"""Where a job's per-file work runs: in this process, a process pool on this machine, or a Dask cluster.

Each task is a top-level function a pool or a Dask worker imports by name: `build_file` (here) builds or reuses
one file's cached model and probes its rank; `job_parquet.write_rank` writes one rank's Parquet.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol

from stallhound.formats import open_profile
from stallhound.jobs.ranks import Probe, probe
from stallhound.model.errors import LoadCancelled

POLL_S = 0.2  # between checks that the load was cancelled while tasks run
# Process pools running at once in this process (a server's every session): each holds up to cores() build processes
# of about 1 GB at peak, and a second pool at once on the same cores only doubles memory for no time won. A load that
# needs a pool while another runs waits for it to end.
MAX_POOLS = 1
POOLS = threading.BoundedSemaphore(MAX_POOLS)


def build_file(path: Path, cache_dir: Path) -> Probe:
    """Build (or reuse from the cache) the model of one file and say what it tells of its rank."""
    start = time.perf_counter()
    profile = open_profile(path, cache_dir=cache_dir)
    try:
        return probe(profile.con, profile.path, profile.fingerprint, profile.model_path, time.perf_counter() - start)
    finally:
        profile.close()


def cores() -> int:
    return os.cpu_count() or 1


class Runner(Protocol):
    """Runs fn(*args) for each args, calling on_done(index, result) as each finishes; raises the first error."""

    def run(self, fn: Callable[..., Any], calls: list[tuple], on_done: Callable[[int, Any], None]) -> None: ...

    def close(self) -> None: ...


class Serial:
    """Everything in this process, one after the other (workers=1)."""

    def __init__(self, cancelled: threading.Event):
        self.cancelled = cancelled

    def run(self, fn: Callable[..., Any], calls: list[tuple], on_done: Callable[[int, Any], None]) -> None:
        for i, args in enumerate(calls):
            if self.cancelled.is_set():
                raise LoadCancelled("loading the job was cancelled")
            on_done(i, fn(*args))

    def close(self) -> None:
        pass


def drain(futures: dict[Any, int], done_of: Callable[[set[Any]], Iterable[Any]],
          on_done: Callable[[int, Any], None], cancelled: threading.Event, cancel: Callable[[], object]) -> None:
    """Hand each finished future's result to on_done as it comes; on the first error or a cancel, drop the rest."""
    pending = set(futures)
    try:
        while pending:
            if cancelled.is_set():
                raise LoadCancelled("loading the job was cancelled")
            for future in done_of(pending):
                pending.discard(future)
                on_done(futures[future], future.result())
    finally:
        if pending:
            cancel()


class Pool:
    """A process pool on this machine, one at a time (MAX_POOLS). Processes are spawned, not forked: a fork would
    copy DuckDB's threads' locks mid-use."""

    def __init__(self, workers: int, cancelled: threading.Event):
        self.cancelled = cancelled
        while not POOLS.acquire(timeout=POLL_S):
            if cancelled.is_set():
                raise LoadCancelled("loading the job was cancelled while it waited for another job's load to end")
        try:
            self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        except (ValueError, OSError):
            POOLS.release()
            raise

    def run(self, fn: Callable[..., Any], calls: list[tuple], on_done: Callable[[int, Any], None]) -> None:
        futures: dict[Future, int] = {self.executor.submit(fn, *args): i for i, args in enumerate(calls)}
        drain(futures, lambda pending: wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)[0], on_done,
              self.cancelled, lambda: [f.cancel() for f in futures])

    def close(self) -> None:
        try:
            self.executor.shutdown(wait=not self.cancelled.is_set(), cancel_futures=True)
        finally:
            POOLS.release()


def runner(workers: int, tasks: int, cancelled: threading.Event, dask_client: Any = None) -> Runner:
    if dask_client is not None:
        from stallhound.jobs.dask import DaskRunner
        return DaskRunner(dask_client, cancelled)
    workers = min(workers, tasks)
    return Serial(cancelled) if workers <= 1 else Pool(workers, cancelled)

