"""What every format's build derives the same way from the model tables it wrote: API call kinds, kernel
categories and NCCL collectives, the capture and GPU windows, and the capability rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import duckdb

from stallhound.formats.comm_kernels import IS_COMM_SQL
from stallhound.model.duck import one_row

LOAD_SOURCE = "stallhound"  # diagnostics.source of the notes a build writes about what it left out
TIME_LIMIT_NOTE = "nsys stopped this capture at its time limit"  # how a build's note on a capture the profiler's
#                                                                  timer ended (not the program) begins
# Kernel categories, decided once per distinct name: 'nccl' for communication kernels of every family of
# formats/comm_kernels.py (NCCL and the libraries beside it), copy-like by the memcpy/memset/copy/fill wording
# PyTorch and CUDA use for data-movement kernels.
KERNEL_CATEGORY_SQL = f"""
CASE WHEN value IS NULL THEN 'other'
     WHEN {IS_COMM_SQL} THEN 'nccl'
     WHEN regexp_matches(lower(value), 'memcpy|memset|copy|fill_kernel') THEN 'copy'
     ELSE 'compute' END"""
API_KIND_SQL = """
CASE WHEN regexp_matches(name, '^(cuda|cu|hip)Graph(Exec)?Launch') THEN 'graph'
     WHEN regexp_matches(name, '^(cuda|cu|hip)(Ext)?(Module)?Launch') THEN 'launch'
     WHEN name ILIKE '%synchronize%' THEN 'sync'
     WHEN name ILIKE '%memcpy%' OR name ILIKE '%MemPrefetch%' THEN 'memcpy'
     WHEN name ILIKE '%memset%' THEN 'memset'
     WHEN regexp_matches(name, '^(cuModuleLoad|cuLibraryLoad|cudaLibraryLoad|cuModuleGetFunction)') THEN 'module'
     WHEN regexp_matches(lower(name), 'malloc|free|hostalloc|memalloc|memfree') THEN 'alloc'
     ELSE 'other' END"""

# (capture start, capture end, GPU start, GPU end): the capture spans every timed event, the GPU window its work.
WINDOW_SQL = """
WITH spans AS (
  SELECT min(start_ns) s, max(end_ns) e FROM kernels UNION ALL SELECT min(start_ns), max(end_ns) FROM memcpy
  UNION ALL SELECT min(start_ns), max(end_ns) FROM memset UNION ALL SELECT min(start_ns), max(end_ns) FROM graph_exec),
host AS (
  SELECT min(start_ns) s, max(end_ns) e FROM cuda_api UNION ALL SELECT min(start_ns), max(coalesce(end_ns, start_ns))
  FROM nvtx UNION ALL SELECT min(start_ns), max(end_ns) FROM os_runtime UNION ALL SELECT min(start_ns), max(end_ns)
  FROM sync UNION ALL SELECT min(time_ns), max(time_ns) FROM sched UNION ALL SELECT min(time_ns), max(time_ns)
  FROM cpu_samples)
SELECT (SELECT min(s) FROM (SELECT s FROM spans UNION ALL SELECT s FROM host)),
       (SELECT max(e) FROM (SELECT e FROM spans UNION ALL SELECT e FROM host)),
       (SELECT min(s) FROM spans), (SELECT max(e) FROM spans)
"""

# capabilities.data -> the model table whose rows it counts, in the capabilities table's order.
DATA_TABLES: dict[str, str] = {
    "kernels": "kernels", "memcpy": "memcpy", "memset": "memset", "cuda_api": "cuda_api", "sync": "sync",
    "nvtx": "nvtx", "os_runtime": "os_runtime", "cpu_samples": "cpu_samples", "sched": "sched",
    "graph_exec": "graph_exec", "memory_usage": "memory_usage", "uvm_faults": "uvm_faults", "stacks": "stacks",
    "gpu_info": "gpus",
}
# What a remedy may ask a capture for besides the capabilities' data: each kernel inside a CUDA graph on its own,
# a capture kept to the program's GPU phase, and CPU samples with the Python frames they ran.
KERNELS_IN_GRAPHS = "kernels_in_graphs"
GPU_PHASE = "gpu_phase"
PYTHON_SAMPLES = "python_samples"
NEEDS = (*(d for d in DATA_TABLES if d != "gpu_info"), KERNELS_IN_GRAPHS, GPU_PHASE, PYTHON_SAMPLES)
GPU_INFO_SQL = "SELECT count(*), count(name) FROM gpus"


def capability_rows(con: duckdb.DuckDBPyConnection, flags: Mapping[str, str],
                    gpu_info: Callable[[int, int], str]) -> list[tuple]:
    """(data, present, rows, capture_flag) per DATA_TABLES entry, from the model tables in `con`: `flags` words what
    records each kind of data, `gpu_info(devices, named)` what the devices' hardware records say (gpu_info counts
    the devices with a hardware name)."""
    rows = []
    for data, table in DATA_TABLES.items():
        if data == "gpu_info":
            devices, named = one_row(con.execute(GPU_INFO_SQL))
            rows.append((data, devices > 0 and named == devices, named, gpu_info(devices, named)))
            continue
        count = one_row(con.execute(f"SELECT count(*) FROM {table}"))[0]
        rows.append((data, count > 0, count, flags[data]))
    return rows
