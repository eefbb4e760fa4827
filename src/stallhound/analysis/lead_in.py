"""What a steady window leaves out of the GPU-active time before it, said by what the trace shows there: work whose
launches the trace did not record (queued before it began recording them: an earlier step still running, as
torch.profiler's warmup step's kernels), GPU work before the first iteration began, and the first iteration when
it is the warmup outlier. None of it is called setup or warmup without that evidence. And what it leaves out after
it (left_after): the GPU work that starts after its last iteration (a last, unbounded one, a final copy back)."""

from __future__ import annotations

import duckdb

from stallhound.analysis.common import counted, ms, shown
from stallhound.model.duck import one_row

# The end of the latest-ending work queued before the trace recorded launches that began before the first iteration
QUEUED_SQL = """
SELECT max(end_ns) FROM (
  SELECT device_id, start_ns, end_ns, launch_start_ns FROM kernels
  UNION ALL SELECT device_id, start_ns, end_ns, launch_start_ns FROM memcpy
  UNION ALL SELECT device_id, start_ns, end_ns, launch_start_ns FROM memset)
WHERE device_id IN (SELECT unnest($devices)) AND launch_start_ns IS NULL AND start_ns >= $gpu_start
  AND start_ns < $first_start
"""


def parts_ns(con: duckdb.DuckDBPyConnection, devices: list[int], gpu_start_ns: int, first_start_ns: int,
             steady_start_ns: int) -> tuple[int, int, int]:
    """(queued, before, first) ns of [gpu_start, steady_start): the device running work queued before the trace
    recorded launches, until the first iteration begins; the rest of the time before the first iteration; the
    first iteration, when the steady window starts after it. They add up to the time left out."""
    queued_end = one_row(con.execute(QUEUED_SQL, {"devices": devices, "gpu_start": gpu_start_ns,
                                                  "first_start": first_start_ns}))[0]
    first_at = max(first_start_ns, gpu_start_ns)
    queued = 0 if queued_end is None else max(0, min(queued_end, first_at) - gpu_start_ns)
    return queued, first_at - gpu_start_ns - queued, max(0, steady_start_ns - first_at)


def left_out(con: duckdb.DuckDBPyConnection, devices: list[int], gpu_start_ns: int, first_start_ns: int,
             steady_start_ns: int, unit: str, first_vs_steady: float | None) -> str:
    """What the steady window leaves out before it, each part by its evidence. A first steady iteration may begin
    before the first GPU work (its host part comes first, as torch.profiler's step ranges do): then nothing is left
    out."""
    if steady_start_ns <= gpu_start_ns:
        early = gpu_start_ns - steady_start_ns
        return "nothing left out before the first steady iteration" + (
            f" (it begins {ms(early)} before the first GPU work)" if shown(early) else "")
    queued, before, first = parts_ns(con, devices, gpu_start_ns, first_start_ns, steady_start_ns)
    said = [text for ns, text in (
        (queued, f"{ms(queued)} while the device ran work launched before the trace recorded launches (none of "
                 "its launch calls is in it: launched earlier, still running)"),
        (before, f"{ms(before)} before the first {unit} began"),
        (first, f"the first {unit}, {ms(first)} ({first_vs_steady}x the steady median: warmup)")) if ns > 0]
    return f"left out {ms(steady_start_ns - gpu_start_ns)} before the first steady iteration: {'; '.join(said)}"


# The device work that starts at or after the steady window's end: kernels, and copies or memsets
AFTER_SQL = """
SELECT count(*) FILTER (WHERE kernel), coalesce(sum(end_ns - start_ns) FILTER (WHERE kernel), 0),
       count(*) FILTER (WHERE NOT kernel), coalesce(sum(end_ns - start_ns) FILTER (WHERE NOT kernel), 0)
FROM (SELECT true AS kernel, device_id, start_ns, end_ns FROM kernels
      UNION ALL SELECT false, device_id, start_ns, end_ns FROM memcpy
      UNION ALL SELECT false, device_id, start_ns, end_ns FROM memset)
WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $end
"""


def left_after(con: duckdb.DuckDBPyConnection, devices: list[int], steady_end_ns: int, gpu_end_ns: int) -> str:
    """What the steady window leaves out after it, said with the work that starts there (cutlass_bench's timed
    sixth GEMM and its 271 ms copy back lay there unsaid); nothing when nothing is left out."""
    if not shown(gpu_end_ns - steady_end_ns):
        return ""
    kernels, kernel_ns, copies, copy_ns = one_row(con.execute(AFTER_SQL, {"devices": devices, "end": steady_end_ns}))
    work = ([f"{counted(kernels, 'kernel')} ({ms(kernel_ns)})"] if kernels else []) + (
        [f"{copies:,} {'copy or memset' if copies == 1 else 'copies or memsets'} ({ms(copy_ns)})"] if copies else [])
    return (f"; left out {ms(gpu_end_ns - steady_end_ns)} after the last steady iteration"
            + (f" (the work that starts there, run times summed: {' and '.join(work)})" if work else ""))
