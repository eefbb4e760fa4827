"""The libraries part of an export's build: which host modules each process's recorded call stacks pass through
(host_modules), and the calls nsys traced into directive runtimes and GPU libraries beside the CUDA API
(library_api). analysis/program.py reads both as evidence of what kind of program made the profile.

It runs on the build's host-side thread, on that thread's cursor, after the strings are loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from stallhound.formats.nsys.activity_join import PID_SQL, TID_SQL

if TYPE_CHECKING:
    from stallhound.formats.nsys.build import Builder

# Call-stack table -> (the events it belongs to, their column that holds the stack's id).
CALLCHAINS = {"SAMPLING_CALLCHAINS": ("COMPOSITE_EVENTS", "id"), "OSRT_CALLCHAINS": ("OSRT_API", "callchainId"),
              "CUDA_CALLCHAINS": ("CUPTI_ACTIVITY_KIND_RUNTIME", "callchainId")}
# Library event table -> library_api.library.
LIBRARY_TABLES = {"CUPTI_ACTIVITY_KIND_OPENACC_DATA": "openacc", "CUPTI_ACTIVITY_KIND_OPENACC_LAUNCH": "openacc",
                  "CUPTI_ACTIVITY_KIND_OPENACC_OTHER": "openacc", "CUBLAS_EVENTS": "cublas",
                  "CUDNN_EVENTS": "cudnn"}


def host_modules(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """One row per (process, module): the distinct call stacks of the process with a frame in the module. A stack's
    frames are deduplicated first (a recursive module appears once per stack)."""
    b.create("host_modules", cur)
    stacks = [f"""SELECT DISTINCT {PID_SQL.format(col='e.globalTid')} AS pid, '{chains}' AS source, c.id, c.module
                  FROM {b.src(chains)} c JOIN {b.src(events)} e ON e."{key}" = c.id"""
              for chains, (events, key) in CALLCHAINS.items()
              if {"id", "module"} <= b.cols(chains) and {key, "globalTid"} <= b.cols(events)]
    if stacks:
        b.sql(f"""INSERT INTO host_modules SELECT s.pid, m.value, count(*)
                  FROM ({' UNION ALL '.join(stacks)}) s JOIN _strings m ON m.id = s.module
                  WHERE m.value IS NOT NULL GROUP BY ALL""", cur)


def library_api(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """The OpenACC, cuBLAS and cuDNN events of the export, on the thread that made them, named from StringIds."""
    b.create("library_api", cur)
    for table, library in LIBRARY_TABLES.items():
        cols = b.cols(table)
        if not {"start", "end", "globalTid"} <= cols:
            continue
        name = "s.value" if "nameId" in cols else "NULL"
        join = "LEFT JOIN _strings s ON s.id = r.nameId" if "nameId" in cols else ""
        b.sql(f"""INSERT INTO library_api
                  SELECT {PID_SQL.format(col='r.globalTid')}, {TID_SQL.format(col='r.globalTid')}, '{library}',
                      {name}, r.start, r."end", r."end" - r.start
                  FROM {b.src(table)} r {join}""", cur)
