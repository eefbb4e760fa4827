"""Where does the host block waiting for the GPU, and does the GPU sit idle while it waits?

Synchronization calls: CUDA API calls of kind 'sync' (cudaDeviceSynchronize, cudaStreamSynchronize,
cudaEventSynchronize, cuCtxSynchronize, ...; copies are not counted here, memory_transfers shows the
synchronous ones) that overlap the window, clipped to it, made by threads that put GPU work on the devices
in scope (a thread that launched nothing counts with its process's devices). blocked_ns sums call durations;
blocked_window_pct = blocked_ns / window. gpu_idle_ns = per call, the time inside it when none of the
devices that thread (process) launched to ran a kernel, memcpy or memset (call interval minus the union
of their work), summed. scope_kind: device (device/context syncs), stream, event, other.
steady_device_syncs: device syncs between the first and last GPU work of the thread's devices in the
window (not setup or teardown). Findings: the idle time the syncs and read-backs cost the devices, from the
idle attribution (tools/idle_causes.py). Times in ns.
"""

from __future__ import annotations

from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.tools import attribution, idle_causes, program
from nsightful.tools.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Output,
    Scope,
    ScopedParams,
    more_rows,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from nsightful.tools.intervals import GPU_WORK, gaps, overlaps

OVERLAP_BUCKETS = 20_000  # time buckets for the call x idle-stretch join
ROOT_CAUSES = {"excessive-synchronization", "blocking-d2h-sync"}  # the idle findings this tool shows
ScopeKind = Literal["device", "stream", "event", "other"]


class Params(ScopedParams):
    limit: LimitParam = DEFAULT_LIMIT


class ApiRow(BaseModel):
    api_name: str
    scope_kind: ScopeKind
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
    apis: list[ApiRow] = Field(description="by blocked time, at most `limit`")
    threads: list[ThreadRow] = Field(description="by blocked time, at most `limit`")
    truncated: bool = Field(description="true when apis or threads were cut at `limit`")
    findings: list[Finding] = []


SQL = "WITH " + GPU_WORK + """,
launches AS (
  SELECT pid, tid, device_id FROM kernels UNION ALL SELECT pid, tid, device_id FROM memcpy
  UNION ALL SELECT pid, tid, device_id FROM memset),
thread_devices AS (SELECT DISTINCT pid, tid, device_id FROM launches WHERE tid IS NOT NULL),
process_devices AS (SELECT DISTINCT pid, device_id FROM launches),
raw_calls AS (
  SELECT row_number() OVER () AS call_id, pid, tid, name,
         CASE WHEN regexp_matches(name, '(Device|Ctx)Synchronize') THEN 'device'
              WHEN name LIKE '%StreamSynchronize%' THEN 'stream' WHEN name LIKE '%EventSynchronize%' THEN 'event'
              ELSE 'other' END AS scope_kind,
         greatest(start_ns, $start) AS start_ns, least(end_ns, $end) AS end_ns
  FROM cuda_api WHERE kind = 'sync' AND end_ns > $start AND start_ns < $end),
call_devices AS (
  SELECT * FROM (
    SELECT c.call_id, d.device_id FROM raw_calls c JOIN thread_devices d ON d.pid = c.pid AND d.tid = c.tid
    UNION ALL
    SELECT c.call_id, d.device_id FROM raw_calls c JOIN process_devices d ON d.pid = c.pid
    WHERE NOT EXISTS (SELECT 1 FROM thread_devices t WHERE t.pid = c.pid AND t.tid = c.tid))
  WHERE device_id IN (SELECT unnest($devices))),
call_sets AS (SELECT call_id, list_sort(list(device_id)) AS devs FROM call_devices GROUP BY call_id),
sets AS (SELECT devs, row_number() OVER (ORDER BY devs) AS lane FROM (SELECT DISTINCT devs FROM call_sets)),
work AS (
  SELECT s.lane, w.start_ns, w.end_ns FROM gpu_work w JOIN (SELECT lane, unnest(devs) AS device_id FROM sets) s
    ON s.device_id = w.device_id
  UNION ALL SELECT lane, $start, $start FROM sets UNION ALL SELECT lane, $end, $end FROM sets),
""" + gaps("idle", "work", "lane") + """,
probes AS (
  SELECT c.call_id AS probe_id, s.lane, c.start_ns, c.end_ns
  FROM raw_calls c JOIN call_sets cs USING (call_id) JOIN sets s USING (devs)),
""" + overlaps("idle_hits", "probes", "idle", "lane") + """,
spans AS (
  SELECT s.devs, min(w.start_ns) AS first_ns, max(w.end_ns) AS last_ns
  FROM (SELECT devs, unnest(devs) AS device_id FROM sets) s JOIN gpu_work w USING (device_id) GROUP BY s.devs),
calls AS MATERIALIZED (
  SELECT c.*, cs.devs, c.end_ns - c.start_ns AS blocked_ns, coalesce(i.idle_ns, 0) AS idle_ns,
         coalesce(c.start_ns > sp.first_ns AND c.end_ns < sp.last_ns, false) AS inside
  FROM raw_calls c JOIN call_sets cs USING (call_id) LEFT JOIN spans sp USING (devs)
  LEFT JOIN (SELECT probe_id AS call_id, sum(end_ns - start_ns) AS idle_ns FROM idle_hits GROUP BY probe_id) i
    USING (call_id)),
by_api AS (
  SELECT {api_name: name, scope_kind: any_value(scope_kind), count: count(*), blocked_ns: sum(blocked_ns),
          mean_ns: round(avg(blocked_ns), 1), max_ns: max(blocked_ns), gpu_idle_ns: sum(idle_ns)} AS a
  FROM calls GROUP BY name),
by_thread AS (
  SELECT {pid: pid, tid: tid, devices: any_value(devs), count: count(*), blocked_ns: sum(blocked_ns),
          device_syncs: count(*) FILTER (WHERE scope_kind = 'device'),
          steady_device_syncs: count(*) FILTER (WHERE scope_kind = 'device' AND inside),
          device_sync_ns: coalesce(sum(blocked_ns) FILTER (WHERE scope_kind = 'device'), 0),
          gpu_idle_ns: sum(idle_ns)} AS t
  FROM calls GROUP BY pid, tid)
SELECT
  (SELECT count(*) FROM calls), (SELECT coalesce(sum(blocked_ns), 0) FROM calls),
  (SELECT coalesce(sum(idle_ns), 0) FROM calls),
  (SELECT list(a ORDER BY a.blocked_ns DESC, a.api_name) FROM by_api),
  (SELECT list(struct_insert(t, thread_name := n.name) ORDER BY t.blocked_ns DESC, t.pid, t.tid)
   FROM by_thread LEFT JOIN (SELECT pid, tid, any_value(name) AS name FROM threads GROUP BY ALL) n
     ON n.pid = t.pid AND n.tid = t.tid)
"""


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    args = {**scope_args(scope), "bucket_ns": max(1000, scope.duration_ns // OVERLAP_BUCKETS)}
    count, blocked, idle, apis, threads = con.execute(SQL, args).fetchone()
    apis, threads = apis or [], threads or []
    found = idle_causes.findings(attribution.attribute(con, scope).devices, program.detect(con))
    return Result(
        scope=scope, call_count=count, blocked_ns=int(blocked), gpu_idle_ns=int(idle),
        apis=[ApiRow(**a, gpu_idle_pct=pct(a["gpu_idle_ns"], a["blocked_ns"])) for a in apis[:params.limit]],
        threads=[ThreadRow(**t, blocked_window_pct=pct(t["blocked_ns"], scope.duration_ns))
                 for t in threads[:params.limit]],
        truncated=len(apis) > params.limit or len(threads) > params.limit,
        findings=[f for f in found if f.root_cause in ROOT_CAUSES])


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
    if result.truncated:
        lines.extend(more_rows(result, None, "API names or threads"))
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
