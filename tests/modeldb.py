"""Tiny in-memory profile models for unit tests.

make_model(kernels=[{...}], nvtx=[{...}], ...) creates every table of model.schema.TABLES in an
in-memory DuckDB, inserts the given rows (dicts; missing columns are NULL, duration_ns is filled in
from start_ns/end_ns when absent), then derives what the nsys build derives: one `gpus` row per device seen
in kernels/memcpy/memset/graph_exec (unless `gpus` is given), the `meta` row with capture and GPU windows
(any field overridable through `meta={...}`) and the `capabilities` rows (nsys' capability_rows); copies and
memsets without launch_start_ns/launch_end_ns get those of their earliest API call of their kind, as the nsys build
joins them.

union_ns(intervals) is the independent reference for interval unions: a plain Python sweep.
"""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import duckdb

from stallhound.formats.nsys.hardware import capability_rows
from stallhound.model.schema import MODEL_VERSION, TABLES, ddl

_TABLES = {t.name: t for t in TABLES}
_DERIVED = ("meta", "capabilities")

_WINDOW_SQL = """
WITH gpu AS (
  SELECT start_ns s, end_ns e FROM kernels UNION ALL SELECT start_ns, end_ns FROM memcpy
  UNION ALL SELECT start_ns, end_ns FROM memset UNION ALL SELECT start_ns, end_ns FROM graph_exec),
host AS (
  SELECT start_ns s, end_ns e FROM cuda_api UNION ALL SELECT start_ns, coalesce(end_ns, start_ns) FROM nvtx
  UNION ALL SELECT start_ns, end_ns FROM os_runtime UNION ALL SELECT start_ns, end_ns FROM sync
  UNION ALL SELECT time_ns, time_ns FROM sched UNION ALL SELECT time_ns, time_ns FROM cpu_samples),
every AS (SELECT * FROM gpu UNION ALL SELECT * FROM host)
SELECT (SELECT min(s) FROM every), (SELECT max(e) FROM every), (SELECT min(s) FROM gpu), (SELECT max(e) FROM gpu)
"""


_LAUNCH_SQL = """UPDATE {table} SET launch_start_ns = a.start_ns, launch_end_ns = a.end_ns
FROM (SELECT pid, correlation_id, min(start_ns) AS start_ns, arg_min(end_ns, start_ns) AS end_ns FROM cuda_api
      WHERE kind = '{table}' GROUP BY ALL) a
WHERE a.pid = {table}.pid AND a.correlation_id = {table}.correlation_id AND {table}.launch_end_ns IS NULL"""


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict]) -> None:
    columns = [c[0] for c in _TABLES[table].columns]
    for row in rows:
        unknown = set(row) - set(columns)
        if unknown:
            raise ValueError(f"{table} has no column(s) {sorted(unknown)}")
        row = dict(row)
        if "duration_ns" in columns and "duration_ns" not in row and row.get("end_ns") is not None:
            row["duration_ns"] = row["end_ns"] - row["start_ns"]
        con.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})",
                    [row.get(c) for c in columns])


def bulk_insert(con: duckdb.DuckDBPyConnection, table: str, columns: Sequence[str], rows: Iterable[Sequence]) -> None:
    """Insert many rows in their order through one CSV read: DuckDB's executemany costs about a millisecond a row,
    minutes for the tens of thousands of rows the build-rule tests stage."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rows.csv"
        with path.open("w", newline="") as out:
            csv.writer(out).writerows([r"\N" if v is None else v for v in row] for row in rows)
        con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM read_csv($path, header = false, "
                    f"all_varchar = true, nullstr = '\\N', columns = $names)",
                    {"path": str(path), "names": {f"c{i}": "VARCHAR" for i in range(len(columns))}})


def make_model(meta: dict | None = None, **tables: list[dict]) -> duckdb.DuckDBPyConnection:
    """An in-memory connection holding the model tables with the given rows."""
    unknown = set(tables) - (set(_TABLES) - set(_DERIVED))
    if unknown:
        raise ValueError(f"unknown or derived table(s): {sorted(unknown)}")
    con = duckdb.connect(":memory:")
    for table in TABLES:
        con.execute(ddl(table.name))
    for name, rows in tables.items():
        _insert(con, name, rows)
    for table in ("memcpy", "memset"):
        con.execute(_LAUNCH_SQL.format(table=table))
    if "gpus" not in tables:
        devices = con.execute("""SELECT DISTINCT device_id FROM (SELECT device_id FROM kernels UNION ALL
            SELECT device_id FROM memcpy UNION ALL SELECT device_id FROM memset UNION ALL
            SELECT device_id FROM graph_exec) WHERE device_id IS NOT NULL ORDER BY 1""").fetchall()
        _insert(con, "gpus", [{"device_id": d} for (d,) in devices])
    cap_start, cap_end, gpu_start, gpu_end = con.execute(_WINDOW_SQL).fetchone()
    row = {"source_path": "memory", "source_bytes": 0, "fingerprint": "test", "model_version": MODEL_VERSION,
           "enum_source": "profile", "capture_start_ns": cap_start, "capture_end_ns": cap_end,
           "duration_ns": None if cap_start is None else cap_end - cap_start,
           "gpu_start_ns": gpu_start, "gpu_end_ns": gpu_end, **(meta or {})}
    _insert(con, "meta", [row])
    con.executemany("INSERT INTO capabilities VALUES (?, ?, ?, ?)", capability_rows(con))
    return con


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals, by a sweep in start order."""
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total
