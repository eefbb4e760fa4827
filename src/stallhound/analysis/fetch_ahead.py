"""Chunked passes read their next chunk while numpy works on the current one: the query runs on a helper thread (DuckDB
releases the GIL), so one core computes while the other reads. Both threads use the caller's own connection, one
statement at a time under a lock, so a cursor's temporary views and tables (a rank's view of a job, the gap pass's
temp table) stay visible, and interrupting that connection stops whichever statement runs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType

import duckdb
import numpy as np

# Chunks being read or read that the caller has not taken yet, each device_pass.ROWS_PER_CHUNK rows of a few columns
# (~15 MB). One overlaps reading with the pass for about a chunk of memory; reading further ahead while a chunk
# waits costs more memory for no more speed.
AHEAD = 1
_DONE = object()  # queued after the last chunk (or when the helper stops), so that the caller's loop ends


class FetchAhead:
    """`sql` run with each of `params` in turn, as fetchnumpy() dicts in that order; statements of the caller's
    own on the connection go through `using()` while the pass runs."""

    def __init__(self, con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[dict]):
        self._con, self._sql, self._params = con, sql, params
        self._lock = threading.Lock()
        self._room = threading.Semaphore(AHEAD)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fetch, name="stallhound-fetch-ahead", daemon=True)

    def __enter__(self) -> FetchAhead:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._room.release()  # a helper waiting for room wakes, sees the stop and ends
        self._thread.join()
        self._queue = queue.SimpleQueue()  # a chunk read for a caller that left is not kept with this object

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        while (item := self._queue.get()) is not _DONE:
            if isinstance(item, Exception):
                raise item
            self._room.release()
            yield item

    @contextmanager
    def using(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The connection, while no chunk is being read on it."""
        with self._lock:
            try:
                yield self._con
            except Exception:
                self._stop.set()  # before the lock is free: the helper reads no further chunk for a failed caller
                raise

    def _fetch(self) -> None:
        end: object = _DONE
        try:
            for params in self._params:
                self._room.acquire()
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._queue.put(self._con.execute(self._sql, params).fetchnumpy())
        except Exception as exc:  # an interrupt or a failed query: raised in the caller's thread by __iter__
            end = exc
        finally:
            self._queue.put(end)
