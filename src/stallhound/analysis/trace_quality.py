"""Can a profile's trace be trusted? One sentence per problem of the trace itself, most severe first, each with its
next action (profile_summary's trace_quality, which triage shows first): what loading left out, launch calls
without kernels, a sample of the CUDA calls (a filtered trace), whole-graph records, CUDA calls or copies without
any kernel, nsys errors, exports cut by another tool, devices without hardware records, GPU work covering a small
part of the capture. Idle findings on a window whose device timeline misses work are not ranked (not_ranked).
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from stallhound.analysis import untraced_kernels
from stallhound.analysis.common import Finding, Window, ms, pct, shown
from stallhound.formats.derive import API_KIND_SQL, GPU_PHASE, KERNELS_IN_GRAPHS, LOAD_SOURCE, TIME_LIMIT_NOTE
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row

MISSING_KERNEL_PCT = 10.0  # a few launches at the capture's end always lack their kernel; past this share the
#                            per-kernel figures miss a real part of the work
SAMPLED_SKIP_IDS = 50  # CUPTI numbers a process's CUDA calls in order (correlation ids); a full recording skips a
#                        few ids per call (the driver calls made inside it), so a skip of 50 or more left calls out
SAMPLED_SHARE_PCT = 25.0  # a quarter of the calls after such a skip: a sample (full traces: < 3%, HTA's sampled 41%)
SAMPLED_MIN_CALLS = 100  # fewer recorded calls give no share to judge
GPU_ACTIVE_MIN_PCT = 50.0  # below half, the capture is mostly host-only time: capture-wide averages understate
#                            the GPU phase

# What the trace-quality notes are decided on. Kernels launched by a plain launch call (not a graph launch)
# are counted per distinct launch API name, so the kind rule runs on a handful of names, not on every kernel.
TRACE_SQL = """
WITH api AS (SELECT count(*) AS calls, count(*) FILTER (WHERE kind = 'launch') AS launches,
                    count(*) FILTER (WHERE kind = 'graph') AS graphs FROM cuda_api),
launched AS (SELECT coalesce(sum(n), 0) AS kernels FROM (
               SELECT launch_api AS name, count(*) AS n FROM kernels WHERE launch_api IS NOT NULL GROUP BY 1)
             WHERE """ + API_KIND_SQL + """ = 'launch')
SELECT api.calls, api.launches, api.graphs, (SELECT count(*) FROM kernels), launched.kernels,
       (SELECT count(*) FROM graph_exec), (SELECT count(*) FROM memcpy), (SELECT count(*) FROM memset),
       (SELECT count(*) FROM diagnostics WHERE severity = 'error')
FROM api, launched
"""
# Launch calls that should each have run a kernel: one per (pid, correlation id), since older exports record
# the runtime and the driver call of one launch under one id; those between a thread's cudaStreamBeginCapture
# and its next cudaStreamEndCapture only record graph nodes, so no kernel runs for them.
CAPTURES = """
WITH marks AS (SELECT pid, tid, start_ns, end_ns, name LIKE '%BeginCapture%' AS opens FROM cuda_api
               WHERE kind = 'other' AND regexp_matches(name, '^(cu|hip)[A-Za-z]*Stream(Begin|End)Capture')),
spans AS (SELECT pid, tid, opens, start_ns, lead(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns) AS end_ns
          FROM marks)"""
LAUNCHES_SQL = CAPTURES + """
SELECT (SELECT count(*) FROM (SELECT DISTINCT pid, correlation_id FROM cuda_api WHERE kind = 'launch')),
       (SELECT count(*) FROM (SELECT DISTINCT a.pid, a.correlation_id FROM cuda_api a JOIN spans s ON a.pid = s.pid
        AND a.tid = s.tid WHERE s.opens AND a.kind = 'launch' AND a.start_ns BETWEEN s.start_ns AND s.end_ns))
"""
# The launches in [$start, $end) (one per (pid, correlation id), none inside a stream capture) and those of them
# whose kernel has no record although their thread launched a kernel that has one later: lost, not run after the
# capture stopped (a capture's last launches, or a cut export's, lack their kernels for that reason alone).
LOST_SQL = CAPTURES + """,
launched AS (SELECT pid, tid, correlation_id, min(start_ns) AS start_ns FROM cuda_api WHERE kind = 'launch'
             GROUP BY ALL),
captured AS (SELECT DISTINCT a.pid, a.correlation_id FROM launched a JOIN spans s ON a.pid = s.pid AND a.tid = s.tid
             WHERE s.opens AND a.start_ns BETWEEN s.start_ns AND s.end_ns),
judged AS (SELECT l.*, k.pid IS NOT NULL AS recorded FROM launched l
           LEFT JOIN (SELECT DISTINCT pid, correlation_id FROM kernels) k USING (pid, correlation_id)
           ANTI JOIN captured c USING (pid, correlation_id)),
last_recorded AS (SELECT pid, tid, max(start_ns) FILTER (WHERE recorded) AS last_ns FROM judged GROUP BY ALL)
SELECT count(*) FILTER (WHERE NOT recorded AND j.start_ns < r.last_ns), count(*)
FROM judged j JOIN last_recorded r USING (pid, tid) WHERE j.start_ns >= $start AND j.start_ns < $end
"""
# The calls begun in [$start, $end) (one per (pid, correlation id)) that follow their process's previous one there by
# $skip ids or more, and all of them but each process's first.
SAMPLED_SQL = """
WITH calls AS (SELECT pid, correlation_id FROM cuda_api
               WHERE correlation_id IS NOT NULL AND start_ns >= $start AND start_ns < $end GROUP BY ALL),
steps AS (SELECT correlation_id - lag(correlation_id) OVER (PARTITION BY pid ORDER BY correlation_id) AS step
          FROM calls)
SELECT count(*) FILTER (WHERE step >= $skip), count(step) FROM steps
"""
LOAD_NOTES_SQL = f"SELECT text FROM diagnostics WHERE source = '{LOAD_SOURCE}' ORDER BY rowid"
CUDA_EVENTS_LOST = "Not all CUDA events might have been collected"  # nsys's own word that its CUDA trace has holes
LOST_EVENTS_SQL = """SELECT min(text) FILTER (WHERE contains(text, $words)),
  count(*) FILTER (WHERE source = $load AND starts_with(text, $cut)) > 0 FROM diagnostics"""
LAST_API_SQL = "SELECT name, end_ns FROM cuda_api ORDER BY end_ns DESC LIMIT 1"
GPU_INFO_SQL = "SELECT capture_flag FROM capabilities WHERE data = 'gpu_info' AND NOT present"
WINDOWS_SQL = """SELECT capture_start_ns, capture_end_ns, gpu_start_ns, gpu_end_ns, machine_gpus, derived_from,
       EXISTS (SELECT 1 FROM gpus) FROM meta"""


class LostKernels(NamedTuple):
    """Kernel records a window lacks: its launches whose kernel was lost (LOST_SQL), of all its launches."""
    lost: int
    launches: int

    @property
    def significant(self) -> bool:
        """Enough lost that the device timeline misses a real part of the work (MISSING_KERNEL_PCT)."""
        return self.launches > 0 and pct(self.lost, self.launches) >= MISSING_KERNEL_PCT


def lost_kernels(con: duckdb.DuckDBPyConnection, start_ns: int, end_ns: int) -> LostKernels:
    """The launches in [start_ns, end_ns) whose kernel records were lost (LOST_SQL), and all of them."""
    return LostKernels(*one_row(con.execute(LOST_SQL, {"start": start_ns, "end": end_ns})))


class SampledCalls(NamedTuple):
    """CUDA calls of a window recorded right after calls the trace left out (SAMPLED_SQL), of all it recorded."""
    skipped: int
    calls: int

    @property
    def significant(self) -> bool:
        """The trace holds a sample of the CUDA calls (SAMPLED_SHARE_PCT): the work the others launched is missing."""
        return self.calls >= SAMPLED_MIN_CALLS and pct(self.skipped, self.calls) >= SAMPLED_SHARE_PCT

    def note(self) -> str:
        return (f"{self.skipped:,} of {self.calls:,} recorded CUDA calls ({pct(self.skipped, self.calls)}%) follow the "
                f"one before by {SAMPLED_SKIP_IDS} correlation ids or more: the trace holds a sample of the calls (a "
                "filtered or sampled trace), so the kernels and copies of the calls left out are missing and the GPU "
                "looks idle where they ran; re-capture without filtering for idle or overlap figures")


def missing_work(lost: LostKernels | None, sampled: SampledCalls | None) -> bool:
    """A window's device timeline misses a real part of its work: kernel records lost, or a sample of the calls."""
    return bool(lost and lost.significant or sampled and sampled.significant)


def not_ranked(f: Finding, lost: LostKernels | None, sampled: SampledCalls | None) -> Finding:
    """An idle finding on a window whose device timeline misses part of its work (missing_work): not ranked as if its
    idle were real."""
    if lost and lost.significant:
        why = (f"; not ranked: {lost.lost:,} of the {lost.launches:,} kernels launched in the window have no record "
               "(lost by the trace), so part of this idle time ran kernels it does not show")
        more = {"lost_kernels": lost.lost, "window_launches": lost.launches}
    else:
        sampled = sampled or SampledCalls(0, 0)
        why = (f"; not ranked: the trace holds a sample of the CUDA calls ({sampled.skipped:,} of the window's "
               f"{sampled.calls:,} recorded calls follow calls it left out), so part of this idle time ran work the "
               "calls left out launched")
        more = {"sampled_after_skip": sampled.skipped, "window_calls": sampled.calls}
    return f.model_copy(update={"severity": "info", "title": f.title + why, "evidence": {**f.evidence, **more}})


def sampled_calls(con: duckdb.DuckDBPyConnection, start_ns: int, end_ns: int) -> SampledCalls:
    """The window's CUDA calls recorded right after calls the trace left out (SAMPLED_SQL), and all of them."""
    return SampledCalls(*one_row(con.execute(SAMPLED_SQL, {"start": start_ns, "end": end_ns,
                                                           "skip": SAMPLED_SKIP_IDS})))


class _Trace(NamedTuple):
    """The counts TRACE_SQL returns."""
    api_calls: int
    launch_calls: int
    graph_calls: int
    kernels: int
    plain_launched_kernels: int
    graph_execs: int
    memcpy: int
    memset: int
    errors: int


def _last_call(con: duckdb.DuckDBPyConnection, capture_end: int) -> str:
    """How long before the capture's end the last CUDA call ended: right before it points at a crash. Nothing when
    the call is the capture's last event: the capture's end is then the call's own (the latest traced event's), so
    the trace cannot say how long the program ran on."""
    last = con.execute(LAST_API_SQL).fetchone()
    return (f" (the last CUDA call, {last[0]}, ended {ms(capture_end - last[1])} before the capture did)"
            if last and shown(capture_end - last[1]) else "")


def _launches(con: duckdb.DuckDBPyConnection, t: _Trace) -> int:
    """Launch calls that should have run a kernel (LAUNCHES_SQL, a scan of every launch call), counted only when
    a note can depend on it: without kernels, or when the raw shortfall reaches MISSING_KERNEL_PCT of the raw
    calls (the exact share, missing / (recorded + missing), can only be lower). Otherwise the raw count."""
    shortfall = t.launch_calls - t.plain_launched_kernels
    if t.kernels and pct(shortfall, t.launch_calls) < MISSING_KERNEL_PCT:
        return t.launch_calls
    launches, captured = one_row(con.execute(LAUNCHES_SQL))
    return launches - captured


def _lost_cuda_events(con: duckdb.DuckDBPyConnection, t: _Trace) -> list[str]:
    """A capture without kernels whose nsys says it lost CUDA events: the absence of GPU work is the trace's."""
    said, cut = one_row(con.execute(LOST_EVENTS_SQL, {"words": CUDA_EVENTS_LOST, "load": LOAD_SOURCE,
                                                       "cut": TIME_LIMIT_NOTE}))
    if said is None:
        return []
    why = ("nsys's timer stopped the capture while the program ran (the note on its time limit), so the records its "
           "process still held were lost: re-capture as that note says" if cut else
           "re-capture with an nsys release that matches the CUDA driver and runtime, with no other profiler "
           "attached to the process, and read nsys's diagnostics for the cause")
    return [f"nsys reports that its CUDA trace of this capture is incomplete (its diagnostics: {said!r}): the export "
            f"holds {t.api_calls:,} CUDA calls, {t.memcpy:,} copies and {t.memset:,} memsets but no kernel, so the "
            "missing GPU work is the trace's, not the program's, and nothing about the GPU can be concluded from it; "
            f"{why}"]


def _launch_notes(con: duckdb.DuckDBPyConnection, t: _Trace, capture: Window, derived: str | None) -> list[str]:
    """Launches without kernels, whole-graph records, CUDA calls or copies without any kernel."""
    launches = _launches(con, t)
    if not (t.kernels or t.graph_execs) and (incomplete := _lost_cuda_events(con, t)):
        return incomplete
    if not (t.kernels or t.graph_execs):
        if launches + t.graph_calls:
            return [untraced_kernels.note(con, launches + t.graph_calls, t.memcpy + t.memset,
                                          _last_call(con, capture.end_ns))]
        if t.memcpy or t.memset:
            return [f"the GPU ran {t.memcpy:,} copies and {t.memset:,} memsets but no kernel was launched in the "
                    f"capture{_last_call(con, capture.end_ns)}: if the program should compute on the GPU it stopped "
                    "before its first launch or launched outside the capture; check its output and exit status"]
        if t.api_calls:
            return [f"{t.api_calls:,} CUDA API calls were traced but the GPU recorded no work"
                    f"{_last_call(con, capture.end_ns)}: the program stopped before its GPU phase or ran it outside "
                    "the capture; check its exit status and the capture range (--capture-range, --delay, --duration)"]
        return []
    notes = []
    missing = max(0, launches - t.plain_launched_kernels)
    if launches and pct(missing, launches) >= MISSING_KERNEL_PCT:
        where = "fall outside this derived export's window, " if derived else ""
        lost = lost_kernels(con, capture.start_ns, capture.end_ns + 1).lost
        how = (f"; {lost:,} of them were launched before a later launch of their thread whose kernel was recorded: "
               "lost by the trace (CUPTI dropped their records), so the device timeline has holes where they ran"
               if lost else "")
        notes.append(f"{missing:,} of {launches:,} kernel launch calls ({pct(missing, launches)}%) have no kernel "
                     f"record: their kernels {where}ran after the capture stopped (the GPU was behind the CPU) or "
                     f"were lost, so per-kernel figures cover only the {t.kernels:,} recorded kernels; capture until "
                     f"the GPU drains (e.g. synchronize before cudaProfilerStop){how}")
    if t.graph_execs:
        notes.append(f"{t.graph_execs:,} CUDA graph launches were recorded as whole graphs (--cuda-graph-trace=graph, "
                     "nsys' default), so the kernels inside them have no records: GPU time counts each graph as "
                     f"one piece of work; re-capture with {remedy(con, (KERNELS_IN_GRAPHS,), bare=True)} for "
                     "per-kernel figures")
    return notes


def window(start: int | None, end: int | None) -> Window | None:
    return None if start is None or end is None else Window(start_ns=start, end_ns=end, duration_ns=end - start)


def of_model(con: duckdb.DuckDBPyConnection) -> list[str]:
    """notes() on the model's capture and GPU-active windows: profile_summary's trace_quality, which triage shows,
    without the summary's other queries."""
    start, end, gpu_start, gpu_end, machine_gpus, derived, has_devices = (
        con.execute(WINDOWS_SQL).fetchone() or (None, None, None, None, None, None, False))
    capture, gpu_active = window(start, end), window(gpu_start, gpu_end)
    active_pct = pct(gpu_active.duration_ns, capture.duration_ns) if capture and gpu_active else None
    return notes(con, capture, gpu_active, active_pct, has_devices, machine_gpus, derived)


def notes(con: duckdb.DuckDBPyConnection, capture: Window | None, gpu_active: Window | None,
          gpu_active_pct: float | None, has_devices: bool, machine_gpus: str | None, derived: str | None) -> list[str]:
    loading = [text for (text,) in con.execute(LOAD_NOTES_SQL).fetchall()]
    if capture is None:
        return loading + ([f"the export lists {machine_gpus} for the machine but recorded no event at all"]
                          if machine_gpus else [])
    t = _Trace(*one_row(con.execute(TRACE_SQL)))
    notes = loading + ([f"nsys recorded {t.errors:,} error message(s) about this capture (see diagnostics): data "
                        "may be missing from it; read them before trusting absences"] if t.errors else [])
    notes += _launch_notes(con, t, capture, derived)
    if (sampled := sampled_calls(con, capture.start_ns, capture.end_ns + 1)).significant:
        notes.append(sampled.note())
    if derived:
        notes.append(f"this export was cut or rewritten by another tool ({derived}), so work crossing its edges is "
                     "partial (e.g. launches whose kernels fall outside it); analyse the original export when you can")
    gpu_info = con.execute(GPU_INFO_SQL).fetchone()
    if has_devices and gpu_info:
        notes.append(gpu_info[0])
    if gpu_active and gpu_active_pct is not None and gpu_active_pct < GPU_ACTIVE_MIN_PCT:
        lead, tail = gpu_active.start_ns - capture.start_ns, capture.end_ns - gpu_active.end_ns
        ends = f"ends {ms(tail)} before the capture does" if shown(tail) else "runs to the capture's end"
        notes.append(f"GPU work spans only {gpu_active_pct}% of the capture: it starts {ms(lead)} in and {ends}, so "
                     "capture-wide figures are diluted by host-only time; "
                     "gpu_utilization and gpu_idle_gaps measure over the GPU-active window by default, and "
                     f"{remedy(con, (GPU_PHASE,))} (or --delay/--duration) keeps the capture to the GPU phase")
    if not has_devices and machine_gpus:
        notes.append(f"the export lists {machine_gpus} for the machine but no work on it was traced")
    return notes
