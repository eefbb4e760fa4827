"""A job's builds on an existing Dask cluster (the optional `distributed` extra).

Each file's build and each rank's Parquet write is one task on the cluster's workers, which read the profiles and
write the models and Parquet in the cache folder: both must be on storage the workers share with this machine.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stallhound.jobs.build import POLL_S, drain
from stallhound.model.errors import DaskUnavailable

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"  # Dask's own convention for where the scheduler is
INSTALL = "pip install 'stallhound[distributed]'"
CONNECT_TIMEOUT_S = 30  # to reach a scheduler: a cluster that is up answers in well under a second


def scheduler_from(address: str | None, scheduler_file: Path | None) -> tuple[str | None, Path | None]:
    """The scheduler the options name, else $DASK_SCHEDULER_ADDRESS; (None, None) for no cluster."""
    if address or scheduler_file:
        return address, scheduler_file
    return os.environ.get(SCHEDULER_ENV) or None, None


def connect(address: str | None, scheduler_file: Path | None) -> Any:
    """A distributed.Client on the scheduler at `address` or described by `scheduler_file`."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise DaskUnavailable(f"building on a Dask cluster needs Dask's distributed package, which is not installed; "
                              f"run `{INSTALL}`, or leave out the scheduler to build on this machine") from exc
    where = address or f"the scheduler file {scheduler_file}"
    try:
        return Client(address=address, scheduler_file=str(scheduler_file) if scheduler_file else None,
                      timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise DaskUnavailable(f"the Dask scheduler at {where} cannot be reached ({exc}); check that it is running "
                              f"and the address (or {SCHEDULER_ENV})") from exc


def _finished(pending: set) -> set:
    """The futures done now, after waiting a poll interval for one (distributed.wait would need a default client,
    and this one is not made the default, to leave the caller's own Dask code alone)."""
    done = {f for f in pending if f.done()}
    if not done:
        time.sleep(POLL_S)
    return done


class DaskRunner:
    """Tasks on a Dask cluster, through a client the caller owns."""

    def __init__(self, client: Any, cancelled: threading.Event):
        self.client, self.cancelled = client, cancelled

    def run(self, fn: Callable[..., Any], calls: list[tuple], on_done: Callable[[int, Any], None]) -> None:
        futures = {self.client.submit(fn, *args, pure=False): i for i, args in enumerate(calls)}
        drain(futures, _finished, on_done, self.cancelled, lambda: self.client.cancel(list(futures)))

    def close(self) -> None:
        pass
