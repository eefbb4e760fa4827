"""What a damaged or altered export may lack, and the notes the model keeps about what was left out.

A raw table missing a column that the nsys build reads is treated as absent (its capability then reads as
missing) and noted; StringIds, which names everything, is essential. Rows whose times cannot be
placed on the timeline are dropped from the model after the scan and counted in a note. Notes are
rows of the model's `diagnostics` table with source LOAD_SOURCE; profile_summary shows them first
among its trace-quality notes.
"""

from __future__ import annotations

import duckdb

from stallhound.formats.derive import LOAD_SOURCE
from stallhound.model.duck import one_row

# Columns the nsys build reads from each raw table without checking for them first.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "StringIds": ("id", "value"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("globalTid", "correlationId", "nameId", "start", "end"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("deviceId", "contextId", "streamId", "globalPid", "correlationId", "start", "end",
                                   "shortName", "demangledName", "gridX", "gridY", "gridZ", "blockX", "blockY",
                                   "blockZ", "registersPerThread", "staticSharedMemory", "dynamicSharedMemory"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("deviceId", "streamId", "globalPid", "correlationId", "start", "end", "bytes",
                                   "copyKind", "srcKind", "dstKind"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("deviceId", "streamId", "globalPid", "correlationId", "start", "end", "bytes"),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ("deviceId", "streamId", "globalPid", "correlationId", "start", "end",
                                            "syncType"),
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": ("deviceId", "contextId", "streamId", "globalPid", "correlationId", "start",
                                        "end"),
    "CUDA_GPU_MEMORY_USAGE_EVENTS": ("deviceId", "globalPid", "start", "bytes", "address", "memoryOperationType",
                                     "memKind"),
    "CUDA_UM_CPU_PAGE_FAULT_EVENTS": ("globalPid", "start", "address"),
    "CUDA_UM_GPU_PAGE_FAULT_EVENTS": ("deviceId", "globalPid", "start", "end", "address"),
    "NVTX_EVENTS": ("globalTid", "start", "end", "eventType", "text"),
    "OSRT_API": ("globalTid", "start", "end", "nameId"),
    "COMPOSITE_EVENTS": ("start", "globalTid"),
    "SCHED_EVENTS": ("start", "globalTid", "isSchedIn", "cpu"),
    "ThreadNames": ("nameId", "globalTid"),
    "PROCESSES": ("pid", "name"),
    "DIAGNOSTIC_EVENT": ("timestamp", "severity", "source", "text"),
}
# Without it no kernel, API call, thread or NVTX range has a name: refuse rather than answer nameless.
ESSENTIAL_TABLES = ("StringIds",)

# Model table -> (start column, end column or None): a row is placed on the timeline only with a start
# at or after the session's origin (nsys times count from it, so a negative one is damage) and, where the
# table has an end, an end not before its start. NVTX ends are left alone: a NULL end is an open range.
TIMED: dict[str, tuple[str, str | None]] = {
    "kernels": ("start_ns", "end_ns"), "memcpy": ("start_ns", "end_ns"), "memset": ("start_ns", "end_ns"),
    "graph_exec": ("start_ns", "end_ns"), "sync": ("start_ns", "end_ns"), "cuda_api": ("start_ns", "end_ns"),
    "os_runtime": ("start_ns", "end_ns"), "nvtx": ("start_ns", None), "cpu_samples": ("time_ns", None),
    "sched": ("time_ns", None), "memory_usage": ("time_ns", None), "uvm_faults": ("start_ns", None),
}
LOAD_SEVERITY = "warning"  # figures still stand for the rest of the data

# Text read by DuckDB's SQLite scanner as it is; bytes that are not UTF-8 become \xNN escapes (instead of
# failing the whole load), the rest stays readable.
UTF8_TEXT_SQL = "coalesce(try(decode(encode({col}))), CAST(encode({col}) AS VARCHAR))"


def missing_columns(table: str, columns: list[str]) -> list[str]:
    """The columns the nsys build needs from `table` that the export's table lacks."""
    return [c for c in REQUIRED_COLUMNS.get(table, ()) if c not in columns]


def left_out_note(table: str, missing: list[str], rows: int) -> str:
    return (f"the export's {table} table has no column {', '.join(missing)} (renamed or written by another tool), "
            f"so its {rows:,} rows were left out and that data reads as missing; re-export the report with "
            "`nsys export --type sqlite` to get it back")


def _bad_time_counts(con: duckdb.DuckDBPyConnection, table: str, start: str, end: str | None) -> tuple[int, ...]:
    end_checks = (f"count(*) FILTER (WHERE {start} >= 0 AND {end} IS NULL)",
                  f"count(*) FILTER (WHERE {start} >= 0 AND {end} < {start})") if end else ("0", "0")
    return one_row(con.execute(f"SELECT count(*), count(*) FILTER (WHERE {start} IS NULL), "
                               f"count(*) FILTER (WHERE {start} < 0), {', '.join(end_checks)} FROM {table}"))


def drop_untimed_rows(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Delete rows that cannot be placed on the timeline (see TIMED); one note per table that had any."""
    notes = []
    for table, (start, end) in TIMED.items():
        total, no_start, negative, no_end, reversed_ = _bad_time_counts(con, table, start, end)
        dropped = no_start + negative + no_end + reversed_
        if not dropped:
            continue
        where = f"{start} IS NULL OR {start} < 0" + (f" OR {end} IS NULL OR {end} < {start}" if end else "")
        con.execute(f"DELETE FROM {table} WHERE {where}")
        counts = ((no_start, "without a start time"), (negative, "with a negative time"),
                  (no_end, "without an end time"), (reversed_, "ending before they start"))
        reasons = [f"{n:,} {why}" for n, why in counts if n]
        notes.append(f"{dropped:,} of {total:,} {table} rows were left out because their times are damaged "
                     f"({', '.join(reasons)}), so figures cover the other {total - dropped:,}; re-export the report "
                     "with `nsys export --type sqlite` if this persists")
    return notes


def record(con: duckdb.DuckDBPyConnection, notes: list[str]) -> None:
    """Append the load notes to the model's diagnostics table (no time: they are about the file)."""
    if notes:
        con.executemany("INSERT INTO diagnostics VALUES (NULL, ?, ?, NULL, ?)",
                        [(LOAD_SEVERITY, LOAD_SOURCE, note) for note in notes])


def clean(con: duckdb.DuckDBPyConnection, raw_notes: list[str]) -> None:
    """After the scan, before devices and windows are derived: drop untimed rows, record every note."""
    record(con, [*raw_notes, *drop_untimed_rows(con)])
