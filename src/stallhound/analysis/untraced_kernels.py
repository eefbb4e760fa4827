"""Why a capture whose program launched kernels holds no kernel records, told from the trace (trace_quality's note):
kernels measured by CUPTI's range profiler (torch.profiler's profiler_metrics), which records them instead of their
activity; a capture on WSL2, where nsys may record the CUDA calls without the GPU's own records; a host that waited on
GPU work, so the kernels ran and the trace lost their records; or none of these, where the program most likely
stopped before its kernels ran or before the profiler flushed them.
"""

from __future__ import annotations

import re

import duckdb

from stallhound.analysis.common import ms
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row

WSL_RELEASE = re.compile(r"microsoft-standard-WSL|WSL2", re.IGNORECASE)  # the kernel release WSL2's kernel reports
WAIT_MIN_NS = 1_000_000  # a sync call that finds the GPU done returns in microseconds (qcu_quda_wsl_apionly's 5,123
#                          cuCtxSynchronize: 3.9 us on average); one that blocks a millisecond waited on GPU work
TOP_WAITS = 3  # sync call names shown, longest total first

EVIDENCE_SQL = """
SELECT (SELECT os_release FROM meta), (SELECT coalesce(profiler_ranges, 0) FROM meta), (SELECT nsys_version FROM meta),
       count(*), coalesce(sum(duration_ns), 0), coalesce(max(duration_ns), 0)
FROM cuda_api WHERE kind = 'sync'"""
WAITS_SQL = """SELECT name, count(*), sum(duration_ns) FROM cuda_api WHERE kind = 'sync' GROUP BY name
ORDER BY 3 DESC, name LIMIT $top"""
RAN_SQL = """
SELECT (SELECT os_release FROM meta), (SELECT coalesce(profiler_ranges, 0) FROM meta),
       (SELECT coalesce(max(duration_ns), 0) FROM cuda_api WHERE kind = 'sync'),
       (SELECT count(*) FROM cuda_api WHERE kind IN ('launch', 'graph')),
       (SELECT count(*) FROM kernels) + (SELECT count(*) FROM graph_exec) + (SELECT count(*) FROM memcpy)
       + (SELECT count(*) FROM memset)"""


def note(con: duckdb.DuckDBPyConnection, launches: int, device_records: int, last_call: str) -> str:
    """The trace note for `launches` kernel launch calls without any kernel (or graph) record, in a capture with
    `device_records` copies and memsets; `last_call` says when the last CUDA call ended (trace_quality._last_call)."""
    os_release, ranges, nsys, syncs, waited_ns, longest_ns = one_row(con.execute(EVIDENCE_SQL))
    head = f"{launches:,} kernel launch calls were traced but the export holds no kernel records"
    if ranges:
        return (f"{head}, and it holds {ranges:,} cuda_profiler_range events (the kernels by name, with the hardware "
                "counters measured for each in their args): the kernels ran under CUPTI's range profiler "
                "(torch.profiler's experimental_config with profiler_metrics), which measures each kernel apart "
                "instead of recording its activity, so the trace has no GPU timeline and the ranges' times are the "
                "profiler's, not the kernels'; for a timeline re-capture with "
                f"{remedy(con, ('kernels',), bare=True)} and no profiler_metrics")
    waits = _waits(con, syncs, waited_ns) if longest_ns >= WAIT_MIN_NS else ""
    if os_release and WSL_RELEASE.search(os_release) and not device_records:
        ran = (f"; {waits}, so the kernels ran" if waits else
               "; no sync call waited on the GPU, so whether the kernels ran cannot be told from this trace")
        return (f"{head} or copy records, and the capture ran on WSL2 (kernel release {os_release}): "
                f"nsys{f' {nsys}' if nsys else ''} recorded the CUDA calls there but none of the GPU's own work, "
                f"which on WSL2 depends on the nsys release, the driver and Windows{ran}. Only the "
                "host side can be read (where and how long the host waited on the GPU: sync_analysis; the launches "
                "and copies it issued), not GPU idle, kernel or copy times; for a device timeline re-capture on "
                "native Linux, or on WSL2 with a current nsys and driver, and check that the export holds kernels")
    if waits:
        return (f"{head}, yet {waits}: the kernels ran and the trace lacks their records, because the profiler did "
                "not record GPU activity where it ran or the process ended before the profiler flushed its buffers"
                f"{last_call}; check the program's exit status and re-capture with "
                f"{remedy(con, ('kernels',), bare=True)}, letting it exit normally (or calling cudaProfilerStop() "
                "first)")
    return (f"{head} and no CUDA call waited on the GPU: the program most likely stopped or crashed before its kernels "
            f"ran or before the profiler flushed its CUDA trace buffers{last_call}, unless kernels were filtered out "
            f"of the trace; check the program's exit status and re-capture with {remedy(con, ('kernels',), bare=True)}"
            ", letting it exit normally (or calling cudaProfilerStop() first)")


def ran_unrecorded(con: duckdb.DuckDBPyConnection) -> bool:
    """The program launched GPU work and the trace shows the GPU did it (range-profiler events, a WSL2 capture, or a
    sync call that blocked WAIT_MIN_NS), yet it holds no kernel, graph, copy or memset record: the device's time
    is not recorded, so its busy and idle shares are unknown, not zero work (the notes above, told apart the same
    way; a launch without any of these is the crash branch: nothing ran)."""
    os_release, ranges, longest_ns, launches, records = one_row(con.execute(RAN_SQL))
    wsl = bool(os_release and WSL_RELEASE.search(os_release))
    return bool(launches and not records and (ranges or wsl or longest_ns >= WAIT_MIN_NS))


def _waits(con: duckdb.DuckDBPyConnection, syncs: int, waited_ns: int) -> str:
    """How long the host waited on the GPU in its sync calls, and in which, longest total first."""
    named = ", ".join(f"{name} x{n:,} {ms(total)}" for name, n, total in
                      con.execute(WAITS_SQL, {"top": TOP_WAITS}).fetchall())
    return f"the host waited {ms(waited_ns)} on the GPU in {syncs:,} sync calls ({named})"
