"""Activity rows (kernels, memcpy, memset, sync, graph launches) joined to the CUDA API call that issued them, once
per correlation-id range (formats.nsys.chunks), so that the API side of each join stays within the build's memory limit.

With several ranges an activity table is first copied into DuckDB, only the columns the build reads: the SQLite
scanner filters nothing, so each range would read the whole table again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import duckdb

from stallhound.formats.build_steps import BuildSteps, Progress
from stallhound.formats.nsys import checks
from stallhound.formats.nsys.chunks import WHOLE, Range, within
from stallhound.formats.nsys.raw import RawExport
from stallhound.model.duck import one_row

PID_SQL = "(({col} >> 24) & 16777215)"  # globalPid/globalTid -> OS pid
TID_SQL = "({col} & 16777215)"  # globalTid -> OS tid

# Columns read where the export has them (checks.REQUIRED_COLUMNS lists those read without checking).
OPTIONAL_COLUMNS = {"CUPTI_ACTIVITY_KIND_KERNEL": ("graphId", "graphNodeId"),
                    "CUPTI_ACTIVITY_KIND_MEMCPY": ("srcDeviceId", "dstDeviceId", "migrationCause"),
                    "CUPTI_ACTIVITY_KIND_MEMSET": ("memKind",),
                    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": ("graphId", "graphExecId")}

Calls = Callable[..., str]  # api_join with its range and mode given: calls(*kinds) is the JOIN's text


def api_join(bounds: Range, earliest: bool, *kinds: str) -> str:
    """Join activity rows `r` to the API call `a` that issued them, on (pid, correlation id), for the ids in
    `bounds` (see formats.nsys.chunks); it ends the query, with the WHERE that keeps `r`'s rows in `bounds`.

    Older exports record both the runtime call and the driver call it makes under one correlation id; with
    `earliest` the outermost (earliest) call is kept so that the join stays one-to-one: one arg_min per id (a
    DISTINCT ON ordered by start costs 1.6x as much: it sorts within each id).
    """
    listed = ", ".join(f"'{k}'" for k in kinds)
    rows = "" if bounds == WHOLE else f" WHERE {within('r.correlationId', bounds, with_null=True)}"
    calls = f"FROM cuda_api WHERE kind IN ({listed}) AND {within('correlation_id', bounds)}"
    if earliest:
        calls = (f"FROM (SELECT pid, correlation_id, min(start_ns) AS start_ns, "
                 f"arg_min({{'tid': tid, 'name': name, 'end_ns': end_ns}}, start_ns) AS first "
                 f"{calls} GROUP BY pid, correlation_id)")
        columns = "first.tid AS tid, first.name AS name, start_ns, first.end_ns AS end_ns"
    else:
        columns = "tid, name, start_ns, end_ns"
    return (f"LEFT JOIN (SELECT pid, correlation_id, {columns} {calls}) a "
            f"ON a.pid = {PID_SQL.format(col='r.globalPid')} AND a.correlation_id = r.correlationId{rows}")


class ActivityJoins(BuildSteps):
    """A build that reads the raw export `raw` and joins its activity tables to their API calls."""

    def __init__(self, raw: RawExport, out: Path, progress: Progress | None, memory_limit: str,
                 cancelled: threading.Event | None = None):
        super().__init__(raw.path, out, progress, memory_limit, cancelled)
        self.raw = raw
        self.ranges = [WHOLE]  # correlation-id ranges of the API joins, set once cuda_api is built
        self.staged: set[str] = set()  # DuckDB copies of activity tables, while their joins run

    def cols(self, table: str) -> set[str]:
        return set(self.raw.columns(table))

    def col(self, table: str, name: str, default: str = "NULL") -> str:
        return f'r."{name}"' if name in self.cols(table) else default

    def src(self, table: str) -> str:
        return self.raw.scan(table)

    def activity(self, table: str, cur: duckdb.DuckDBPyConnection) -> str:
        """Where to read `table`'s rows: the raw table when its API join runs once, else a DuckDB copy of it,
        made on first use (the SQLite scanner filters nothing: each range would scan the whole table again)."""
        if self.ranges == [WHOLE]:
            return self.src(table)
        stage = f"_stage_{table.lower()}"
        if stage not in self.staged:
            self.sql(f"CREATE TABLE {stage} AS SELECT {self.read_columns(table)} FROM {self.src(table)}", cur)
            self.staged.add(stage)
        return stage

    def read_columns(self, table: str) -> str:
        """The columns of `table` that the build reads: a copy of all of them costs twice as much (the kernel table
        has 40, one of them text)."""
        wanted = (*checks.REQUIRED_COLUMNS[table], *OPTIONAL_COLUMNS.get(table, ()))
        return ", ".join(f'"{c}"' for c in wanted if c in self.cols(table))

    def joined(self, table: str, into: str, query: Callable[[str, Calls], str],
               cur: duckdb.DuckDBPyConnection) -> None:
        """Run `query(source, calls)`, which inserts `table`'s rows joined by `calls(*kinds)` (api_join) to their API
        calls into the model table `into`, once per correlation-id range.

        Most exports record one call per id, so each range is first joined to every call of its ids, without
        picking the earliest (a third of the join's cost); a range that wrote more rows than it read had ids
        with several calls and is written again, picking the earliest."""
        source = self.activity(table, cur)
        for bounds in self.ranges:
            self.sql(query(source, partial(api_join, bounds, False)), cur)
            if one_row(cur)[0] > self.activity_rows(table, source, bounds, cur):
                self.sql(f"DELETE FROM {into} WHERE {within('correlation_id', bounds, with_null=True)}", cur)
                self.sql(query(source, partial(api_join, bounds, True)), cur)
        if source in self.staged:
            self.sql(f"DROP TABLE {source}", cur)
            self.staged.discard(source)

    def activity_rows(self, table: str, source: str, bounds: Range, cur: duckdb.DuckDBPyConnection) -> int:
        if source not in self.staged:
            return self.raw.count(table)
        cur.execute(f"SELECT count(*) FROM {source} WHERE {within('correlationId', bounds, with_null=True)}")
        return one_row(cur)[0]
