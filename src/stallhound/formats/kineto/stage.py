"""Staging a Kineto trace's rows into DuckDB while the trace is still being parsed.

Rows are inserted a batch at a time, each column sent as one JSON array (DuckDB converts Python lists value by
value, tens of microseconds each; JSON text it parses in bulk). The inserts run on a writer thread with its own
cursor: DuckDB releases the GIL while it parses and appends a batch, so that work overlaps the parse of the next
batches (about a quarter of staging's CPU time) instead of following it.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

import duckdb

from stallhound.formats.kineto.workers import encode_columns
from stallhound.model.errors import StallhoundError

if TYPE_CHECKING:
    from stallhound.formats.build_steps import BuildSteps

BATCH_ROWS = 20_000  # staged rows per insert: ~10 MB of Python objects at a time, however large the trace
QUEUED_BATCHES = 2  # batches waiting for the writer: enough to keep it busy, few enough to bound memory


class Writer:
    """Runs the staging inserts, in order, on a background thread; the first error is raised to the parser."""

    def __init__(self, builder: BuildSteps):
        self.builder, self.cur = builder, builder.con.cursor()
        self.error: duckdb.Error | StallhoundError | None = None
        # (insert, rows) or (insert, its columns already encoded: kineto.workers)
        self.jobs: queue.Queue[tuple[str, list, bool] | None] = queue.Queue(maxsize=QUEUED_BATCHES)
        self.thread = threading.Thread(target=self._run, name="stallhound-kineto-stage", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if self.error is not None:
                continue  # drain, so that the parser never blocks on a full queue
            insert, rows, encoded = job
            try:
                if self.builder.cancelled.is_set():
                    raise self.builder.cancelled_error()
                columns = rows if encoded else encode_columns(rows)
                self.builder.sql(insert, self.cur, params={f"c{i}": col for i, col in enumerate(columns)})
            except (duckdb.Error, StallhoundError) as exc:
                self.error = exc

    def put(self, insert: str, rows: list[tuple]) -> None:
        self._raise()
        self.jobs.put((insert, rows, False))

    def put_columns(self, insert: str, columns: list[str]) -> None:
        """Queue the insert of rows whose columns a worker encoded (kineto.workers.encode_columns)."""
        self._raise()
        self.jobs.put((insert, columns, True))

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error
        if self.builder.cancelled.is_set():
            raise self.builder.cancelled_error()

    def close(self, failed: bool) -> None:
        """Wait for the queued inserts; raise the writer's error unless the parse already `failed`."""
        self.jobs.put(None)
        self.thread.join()
        self.cur.close()
        if not failed:
            self._raise()


class Stage:
    """Rows for one staging table, handed to the writer a batch at a time."""

    def __init__(self, writer: Writer, table: str, columns: tuple[tuple[str, str], ...]):
        self.writer = writer
        self.rows: list[tuple] = []
        writer.builder.sql(f"CREATE TABLE {table} ({', '.join(f'{name} {typ}' for name, typ in columns)})")
        self.insert = f"INSERT INTO {table} SELECT " + ", ".join(
            f"unnest(from_json($c{i}, '[\"{typ}\"]'))" for i, (_, typ) in enumerate(columns))

    def add(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.put(self.insert, self.rows)
            self.rows = []
