"""Where does the host block waiting for the GPU, and does the GPU sit idle while it waits?

Synchronization calls: CUDA API calls of kind 'sync' (cudaDeviceSynchronize, cudaStreamSynchronize,
cudaEventSynchronize, cuCtxSynchronize, ...; copies are not counted here, memory_transfers shows the
synchronous ones) that overlap the window, clipped to it, made by threads that put GPU work on the devices
in scope (a thread that launched nothing counts with its process's devices; with every device in scope, a process
with no GPU work recorded, as in a capture of API calls alone, counts with no device: its calls are counted, the GPU
idle inside them is unknown and counts 0). blocked_ns sums call durations;
blocked_window_pct = blocked_ns / window. gpu_idle_ns = per call, the time inside it when none of the
devices that thread (process) launched to ran a kernel, memcpy or memset (call interval minus the union
of their work), summed. scope_kind (analysis/rules.py): device (device, context and the deprecated thread
syncs), stream, event, other; device_sync_count and device_sync_ns cover every thread's device syncs.
steady_device_syncs: device syncs between the first and last GPU work of the thread's devices in the
window (not setup or teardown). Findings: the idle time the syncs and read-backs cost the devices, from the
idle attribution (analysis/idle_causes.py). Times in ns.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field, PrivateAttr

from stallhound.analysis import idle_causes, rules
from stallhound.analysis.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Output,
    Scope,
    ScopedParams,
    devices_of,
    more_rows,
    ms,
    pct,
    records,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.idle_causes import IdleBasis
from stallhound.analysis.intervals import GPU_WORK, gaps, overlaps

OVERLAP_BUCKETS = 20_000  # time buckets for the call x idle-stretch join
ROOT_CAUSES = {"excessive-synchronization", "blocking-d2h-sync"}  # the idle findings this tool shows
TRIAGE = TriageRole("part", of="gpu_idle_gaps")  # ranked by triage among all the idle findings


class Params(ScopedParams):
    limit: LimitParam = DEFAULT_LIMIT


class ApiRow(BaseModel):
    api_name: str
    scope_kind: rules.SyncScope
    count: int
    blocked_ns: int
    mean_ns: float
    max_ns: int
    gpu_idle_ns: int
    gpu_idle_pct: float = Field(description="gpu_idle_ns / blocked_ns")


class ThreadRow(BaseModel):
    pid: int
    tid: int
    thread_name: str | None
    devices: list[int] = Field(description="devices this thread (or its process) put work on")
    count: int
    blocked_ns: int
    blocked_window_pct: float
    device_syncs: int = Field(description="device/context-wide sync calls")
    steady_device_syncs: int = Field(description="those between the first and last GPU work of its devices "
                                                 "(not setup or teardown)")
    device_sync_ns: int = Field(description="host time blocked in them")
    gpu_idle_ns: int


class Result(Output):
    scope: Scope
    call_count: int
    blocked_ns: int
    gpu_idle_ns: int = Field(description="GPU idle time while the host waited, summed over calls")
    device_sync_count: int = Field(description="device/context-wide sync calls, all threads")
    device_sync_ns: int = Field(description="host time blocked in them")
    no_device_calls: int = Field(description="calls of processes with no GPU work recorded: the GPU idle inside them "
                                             "is unknown (counted 0)")
    apis: list[ApiRow] = Field(description="by blocked time, at most `limit`")
    threads: list[ThreadRow] = Field(description="by blocked time, at most `limit`")
    truncated: bool = Field(description="true when apis or threads were cut at `limit`")
    findings: list[Finding] = []
    _idle: IdleBasis | None = PrivateAttr(None)  # what findings() reads: the window's idle attribution, not shown


# The stages: find the calls (each with its scope and the devices its thread launched to), measure the idle
# time inside them, group by API and by thread, then name the threads shown. Each stage leaves a temp table
# private to the cursor (the model itself is read-only) or returns rows read by column name.
FIND_SQL = """CREATE OR REPLACE TEMP TABLE sync_calls AS
WITH launches AS (
  SELECT pid, tid, device_id FROM kernels UNION ALL SELECT pid, tid, device_id FROM memcpy
  UNION ALL SELECT pid, tid, device_id FROM memset),
thread_devices AS (SELECT DISTINCT pid, tid, device_id FROM launches WHERE tid IS NOT NULL),
process_devices AS (SELECT DISTINCT pid, device_id FROM launches),
raw_calls AS (
  SELECT row_number() OVER () AS call_id, pid, tid, name, """ + rules.sync_scope_sql("name") + """ AS scope_kind,
         greatest(start_ns, $start) AS start_ns, least(end_ns, $end) AS end_ns
  FROM cuda_api WHERE kind = 'sync' AND end_ns > $start AND start_ns < $end),
call_devices AS (
  SELECT * FROM (
    SELECT c.call_id, d.device_id FROM raw_calls c JOIN thread_devices d ON d.pid = c.pid AND d.tid = c.tid
    UNION ALL
    SELECT c.call_id, d.device_id FROM raw_calls c JOIN process_devices d ON d.pid = c.pid
    WHERE NOT EXISTS (SELECT 1 FROM thread_devices t WHERE t.pid = c.pid AND t.tid = c.tid))
  WHERE device_id IN (SELECT unnest($devices)))
SELECT c.*, coalesce(d.devs, []) AS devs FROM raw_calls c
LEFT JOIN (SELECT call_id, list_sort(list(device_id)) AS devs FROM call_devices GROUP BY call_id) d USING (call_id)
WHERE d.devs IS NOT NULL OR ($every_device AND c.pid NOT IN (SELECT pid FROM process_devices))
"""

# Per call: the time inside it when none of its devices ran anything (one lane per distinct device set), and
# whether it lies between the first and last GPU work of those devices (each device's first and last work
# found once, then combined per set: no join of every operation with the sets).
IDLE_SQL = "CREATE OR REPLACE TEMP TABLE sync_idle AS WITH " + GPU_WORK + """,
sets AS (SELECT devs, row_number() OVER (ORDER BY devs) AS lane FROM (
  SELECT DISTINCT devs FROM sync_calls WHERE len(devs) > 0)),
work AS (
  SELECT s.lane, w.start_ns, w.end_ns FROM gpu_work w JOIN (SELECT lane, unnest(devs) AS device_id FROM sets) s
    ON s.device_id = w.device_id
  UNION ALL SELECT lane, $start, $start FROM sets UNION ALL SELECT lane, $end, $end FROM sets),
""" + gaps("idle", "work", "lane") + """,
probes AS (SELECT c.call_id AS probe_id, s.lane, c.start_ns, c.end_ns FROM sync_calls c JOIN sets s USING (devs)),
""" + overlaps("idle_hits", "probes", "idle", "lane") + """,
ends AS (SELECT device_id, min(start_ns) AS first_ns, max(end_ns) AS last_ns FROM gpu_work GROUP BY device_id),
spans AS (
  SELECT s.devs, min(e.first_ns) AS first_ns, max(e.last_ns) AS last_ns
  FROM (SELECT devs, unnest(devs) AS device_id FROM sets) s JOIN ends e USING (device_id) GROUP BY s.devs)
SELECT c.call_id, coalesce(i.idle_ns, 0) AS idle_ns,
       coalesce(c.start_ns > sp.first_ns AND c.end_ns < sp.last_ns, false) AS inside
FROM sync_calls c LEFT JOIN spans sp USING (devs)
LEFT JOIN (SELECT probe_id AS call_id, sum(end_ns - start_ns) AS idle_ns FROM idle_hits GROUP BY probe_id) i
  USING (call_id)
"""

CALLS = """(SELECT c.*, c.end_ns - c.start_ns AS blocked_ns, i.idle_ns, i.inside
           FROM sync_calls c JOIN sync_idle i USING (call_id))"""
TOTALS_SQL = f"""
SELECT count(*) AS call_count, coalesce(sum(blocked_ns), 0) AS blocked_ns, coalesce(sum(idle_ns), 0) AS gpu_idle_ns,
       count(*) FILTER (WHERE scope_kind = 'device') AS device_sync_count,
       coalesce(sum(blocked_ns) FILTER (WHERE scope_kind = 'device'), 0) AS device_sync_ns,
       count(*) FILTER (WHERE len(devs) = 0) AS no_device_calls
FROM {CALLS}"""
APIS_SQL = f"""
SELECT name AS api_name, any_value(scope_kind) AS scope_kind, count(*) AS count, sum(blocked_ns) AS blocked_ns,
       round(avg(blocked_ns), 1) AS mean_ns, max(blocked_ns) AS max_ns, sum(idle_ns) AS gpu_idle_ns
FROM {CALLS} GROUP BY name ORDER BY blocked_ns DESC, api_name LIMIT $limit + 1"""
THREADS_SQL = f"""
SELECT pid, tid, any_value(devs) AS devices, count(*) AS count, sum(blocked_ns) AS blocked_ns,
       count(*) FILTER (WHERE scope_kind = 'device') AS device_syncs,
       count(*) FILTER (WHERE scope_kind = 'device' AND inside) AS steady_device_syncs,
       coalesce(sum(blocked_ns) FILTER (WHERE scope_kind = 'device'), 0) AS device_sync_ns,
       sum(idle_ns) AS gpu_idle_ns
FROM {CALLS} GROUP BY pid, tid ORDER BY blocked_ns DESC, pid, tid LIMIT $limit + 1"""
NAMES_SQL = """
SELECT t.pid, t.tid, any_value(t.name) AS name FROM threads t
JOIN (SELECT unnest($pids) AS pid, unnest($tids) AS tid) k ON k.pid = t.pid AND k.tid = t.tid GROUP BY ALL"""
STAGE_TABLES = ("sync_calls", "sync_idle")


def find(con: duckdb.DuckDBPyConnection, scope: Scope) -> None:
    """Stage 1: the temp table sync_calls(call_id, pid, tid, name, scope_kind, start_ns, end_ns, devs)."""
    con.execute(FIND_SQL, {**scope_args(scope), "every_device": scope.devices == devices_of(con)})


def measure_idle(con: duckdb.DuckDBPyConnection, scope: Scope) -> None:
    """Stage 2 (after find): the temp table sync_idle(call_id, idle_ns, inside)."""
    con.execute(IDLE_SQL, {**scope_args(scope), "bucket_ns": max(1000, scope.duration_ns // OVERLAP_BUCKETS)})


def group(con: duckdb.DuckDBPyConnection, limit: int) -> tuple[dict, list[dict], list[dict]]:
    """Stage 3: the totals, and the first limit + 1 APIs and threads by blocked time."""
    return (records(con, TOTALS_SQL, {})[0], records(con, APIS_SQL, {"limit": limit}),
            records(con, THREADS_SQL, {"limit": limit}))


def name_threads(con: duckdb.DuckDBPyConnection, threads: list[dict]) -> list[dict]:
    """Stage 4: the threads shown, each with its name (None when the export names none)."""
    found = records(con, NAMES_SQL, {"pids": [t["pid"] for t in threads], "tids": [t["tid"] for t in threads]})
    names = {(n["pid"], n["tid"]): n["name"] for n in found}
    return [{**t, "thread_name": names.get((t["pid"], t["tid"]))} for t in threads]


def drop_stages(con: duckdb.DuckDBPyConnection) -> None:
    """The stages' temp tables, dropped once a caller has read what it needs."""
    for table in STAGE_TABLES:
        con.execute(f"DROP TABLE IF EXISTS {table}")


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    try:
        find(con, scope)
        measure_idle(con, scope)
        totals, apis, threads = group(con, params.limit)
    finally:
        drop_stages(con)
    result = Result(
        scope=scope, **totals,
        apis=[ApiRow(**a, gpu_idle_pct=pct(a["gpu_idle_ns"], a["blocked_ns"])) for a in apis[:params.limit]],
        threads=[ThreadRow(**t, blocked_window_pct=pct(t["blocked_ns"], scope.duration_ns))
                 for t in name_threads(con, threads[:params.limit])],
        truncated=len(apis) > params.limit or len(threads) > params.limit)
    result._idle = idle_causes.basis(con, scope, idle_causes.step_ns(con, scope.profile, params.device))
    return result


def findings(result: Result) -> list[Finding]:
    """The window's idle findings of ROOT_CAUSES (analysis/idle_causes.py)."""
    return result._idle.shown(ROOT_CAUSES) if result._idle else []


def render(result: Result) -> str:
    s = result.scope
    lines = [f"{result.call_count:,} blocking calls, host blocked {ms(result.blocked_ns)} "
             f"({pct(result.blocked_ns, s.duration_ns):.1f}% of {ms(s.duration_ns)}); GPU idle meanwhile "
             f"{ms(result.gpu_idle_ns)}"]
    lines.extend(f"{a.api_name:<28} {a.scope_kind:<6} x{a.count:<6,} blocked {ms(a.blocked_ns):>14} "
                 f"(max {ms(a.max_ns)}), GPU idle {a.gpu_idle_pct:.0f}%" for a in result.apis)
    lines.extend(f"thread {t.pid}/{t.tid} {t.thread_name or ''} devices {t.devices}: x{t.count:,}, blocked "
                 f"{t.blocked_window_pct:.1f}% of window, {t.device_syncs} device syncs, GPU idle {ms(t.gpu_idle_ns)}"
                 for t in result.threads)
    if result.no_device_calls:
        lines.append(f"note: {result.no_device_calls:,} calls come from processes with no GPU work recorded (a capture "
                     "of API calls alone): the GPU idle inside them is unknown, counted 0")
    if result.truncated:
        lines.extend(more_rows(result, None, "API names or threads"))
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
