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
# 2**53 ns after the session's origin (104 days): no capture runs that long, and past it a time is no longer exact as a
# JSON number or a double, so sums and windows over it would be wrong; such a time is damage, as a negative one is.
MAX_TIME_NS = 2**53
# Model table -> the columns that name what a row is about (the device it ran on, the process that issued it): a row
# without one cannot be attributed, and the tools and their results take them as always present.
KEYED: dict[str, tuple[str, ...]] = {
    "kernels": ("device_id", "pid"), "memcpy": ("device_id", "pid"), "memset": ("device_id", "pid"),
    "graph_exec": ("device_id", "pid"), "sync": ("pid",), "cuda_api": ("pid", "tid"), "os_runtime": ("pid", "tid"),
    "nvtx": ("pid", "tid"), "cpu_samples": ("pid", "tid"), "sched": ("pid", "tid"), "memory_usage": ("pid",),
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


def damaged_note(table: str) -> str:
    return (f"the export's {table} table is damaged (SQLite reports its pages as malformed), so its rows were left out "
            "and that data reads as missing; re-export the report with `nsys export --type sqlite` to get it back")


def _faults(table: str) -> list[tuple[str, str]]:
    """(SQL condition, why) of each way a row of `table` can be damaged, as the note words it."""
    start, end = TIMED[table]
    faults = [(f"{start} IS NULL", "without a start time"), (f"{start} < 0", "with a negative time"),
              (f"{start} > {MAX_TIME_NS}", "with a time beyond 104 days")]
    if end:
        faults += [(f"{end} IS NULL", "without an end time"), (f"{end} > {MAX_TIME_NS}", "ending beyond 104 days"),
                   (f"{end} < {start}", "ending before they start")]
    return faults + [(f"{key} IS NULL", f"without a {KEY_WORDS[key]}") for key in KEYED.get(table, ())]


KEY_WORDS = {"device_id": "device", "pid": "process id", "tid": "thread id"}


def _first_fault_counts(con: duckdb.DuckDBPyConnection, table: str, faults: list[tuple[str, str]]) -> tuple[int, ...]:
    """Rows of `table`, then the rows each fault counts that no earlier fault did (each row counted once)."""
    counts = [f"count(*) FILTER (WHERE ({cond}) AND NOT coalesce({' OR '.join(c for c, _ in faults[:i]) or 'false'}, "
              f"false))" for i, (cond, _) in enumerate(faults)]
    return one_row(con.execute(f"SELECT count(*), {', '.join(counts)} FROM {table}"))


def drop_damaged_rows(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Delete rows that cannot be placed on the timeline or attributed (TIMED, MAX_TIME_NS, KEYED); one note per table
    that had any."""
    notes = []
    for table in TIMED:
        faults = _faults(table)
        total, *counts = _first_fault_counts(con, table, faults)
        dropped = sum(counts)
        if not dropped:
            continue
        con.execute(f"DELETE FROM {table} WHERE {' OR '.join(f'coalesce({c}, false)' for c, _ in faults)}")
        reasons = [f"{n:,} {why}" for n, (_, why) in zip(counts, faults, strict=True) if n]
        notes.append(f"{dropped:,} of {total:,} {table} rows were left out because their times or ids are damaged "
                     f"({', '.join(reasons)}), so figures cover the other {total - dropped:,}; re-export the report "
                     "with `nsys export --type sqlite` if this persists")
    return notes


def record(con: duckdb.DuckDBPyConnection, notes: list[str]) -> None:
    """Append the load notes to the model's diagnostics table (no time: they are about the file)."""
    if notes:
        con.executemany("INSERT INTO diagnostics VALUES (NULL, ?, ?, NULL, ?)",
                        [(LOAD_SEVERITY, LOAD_SOURCE, note) for note in notes])


def clean(con: duckdb.DuckDBPyConnection, raw_notes: list[str]) -> None:
    """After the scan, before devices and windows are derived: drop damaged rows, record every note."""
    record(con, [*raw_notes, *drop_damaged_rows(con)])
