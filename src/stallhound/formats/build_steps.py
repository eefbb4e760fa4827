"""What every model build shares (an nsys export's, a Kineto trace's): its DuckDB connection and settings, its
declared progress steps, and cancellation by an event."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import duckdb

from stallhound.model.cache import Progress
from stallhound.model.duck import OFFLINE, Settings
from stallhound.model.errors import LoadCancelled
from stallhound.model.schema import ddl

BUILD_SETTINGS: Settings = {
    "preserve_insertion_order": False,  # lets large CREATE TABLE AS stream without buffering
    # The model file in DuckDB 1.5's storage format rather than the default one readable by 0.10.2: its strings are
    # compressed as DICT_FSST, one analysis instead of two, so builds are cheaper, models smaller and first queries
    # faster (BENCHMARKS-HISTORY.md). Only this package reads the file, with the DuckDB it was written by (pyproject
    # pins 1.5).
    "storage_compatibility_version": "v1.5.0",
}
NO_PROGRESS_BAR = "SET enable_progress_bar = false"  # progress goes to MCP notifications, never to stdout
# How long a finished build's cancel watcher may linger (a cancel itself is seen at once): short, as every
# build waits for it before closing its connection.
CANCEL_POLL_S = 0.02
# Rows bound into one INSERT ... VALUES: executemany runs one statement per row, each costing milliseconds; 500 rows
# of a few columns keep one statement's parameters small.
ROWS_PER_INSERT = 500


class BuildSteps:
    """What every model build shares (an nsys export's, a Kineto trace's): its connection, its progress steps
    (`steps`, each reported once by its label, in any order), and its `cancelled` event: set from another thread,
    it stops the build at the next query or step."""

    steps: tuple[str, ...]
    settings: ClassVar[Settings] = {}  # a format's own connection settings, beside BUILD_SETTINGS

    def __init__(self, source: Path, out: Path, progress: Progress | None, memory_limit: str,
                 cancelled: threading.Event | None = None):
        self.source, self.progress = source, progress
        self.con = duckdb.connect(str(out), config={**OFFLINE, **BUILD_SETTINGS, **self.settings,
                                                   "memory_limit": memory_limit})
        self.con.execute(NO_PROGRESS_BAR)
        self.cancelled = cancelled or threading.Event()
        self.done = 0
        self.batched = False  # whether batch() makes its block one transaction

    @contextmanager
    def batch(self, cur: duckdb.DuckDBPyConnection | None = None) -> Iterator[None]:
        """The block's statements on `cur` (else the build's connection) as one transaction when the build is
        `batched`: DuckDB syncs its write-ahead log to disk at each commit, and a statement outside a transaction is
        its own commit (tens of syncs: on a busy disk, a small build's largest wait). A failed block leaves its
        transaction open: closing the connection (running) throws it away with the unfinished model."""
        if not self.batched:
            yield
            return
        (cur or self.con).execute("BEGIN TRANSACTION")
        yield
        (cur or self.con).execute("COMMIT")

    def in_batch(self, work: Callable[[duckdb.DuckDBPyConnection], None], cur: duckdb.DuckDBPyConnection) -> None:
        """`work(cur)` as one batch (a build's side, on its own cursor and thread)."""
        with self.batch(cur):
            work(cur)

    @contextmanager
    def running(self) -> Iterator[None]:
        """The build's connection, closed when the block ends; while it runs, setting `cancelled` (from any thread)
        interrupts the query under way."""
        finished = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(finished,), name="stallhound-build-cancel", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            finished.set()
            watcher.join()
            self.con.close()

    def _watch(self, finished: threading.Event) -> None:
        while not finished.is_set():
            if self.cancelled.wait(CANCEL_POLL_S):
                self.con.interrupt()
                return

    def cancelled_error(self) -> LoadCancelled:
        return LoadCancelled(f"loading {self.source} was cancelled")

    def step(self, label: str) -> None:
        if label not in self.steps:
            raise ValueError(f"'{label}' is not one of this build's steps {self.steps}")
        if self.cancelled.is_set():
            raise self.cancelled_error()
        self.done += 1
        if self.progress:
            self.progress(self.done, len(self.steps), label)

    def sql(self, query: str, cur: duckdb.DuckDBPyConnection | None = None, params: dict | None = None) -> None:
        try:
            (cur or self.con).execute(query, params)
        except duckdb.InterruptException as exc:
            raise self.cancelled_error() from exc

    def create(self, table: str, cur: duckdb.DuckDBPyConnection | None = None) -> None:
        self.sql(ddl(table), cur)

    def load_list(self, table: str, rows: list[tuple]) -> None:
        self.create(table)
        insert_rows(self.con, table, rows)


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple]) -> None:
    """Python rows into `table`, ROWS_PER_INSERT per statement (executemany runs one statement per row)."""
    for first in range(0, len(rows), ROWS_PER_INSERT):
        batch = rows[first:first + ROWS_PER_INSERT]
        row = f"({', '.join('?' * len(batch[0]))})"
        con.execute(f"INSERT INTO {table} VALUES {', '.join([row] * len(batch))}", [v for r in batch for v in r])
