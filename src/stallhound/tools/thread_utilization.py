"""Which CPU threads are busiest, and is one of them running flat out?

busy_ns per thread over the window (default: whole capture), from the best data the profile has
(`basis`): 'sched' = time on a CPU, from each sched-in to the thread's next sched-out (scheduler
events), clipped to the window; 'cpu_samples' = samples in the window x sampling period (the median
spacing of consecutive samples of a thread), at most the window; 'cuda_api' = union of the thread's
CUDA API calls except synchronization calls, plus OS-runtime calls that are not waits (poll, futex,
sleep, ... excluded); a launch call that waits for a full launch queue still counts, so this basis is traced
activity, not CPU time. busy_pct = busy_ns / window. With `device`, only threads of processes that launched
kernels on it. blocked_ns = the thread's time inside blocking CUDA calls (a synchronize or a synchronous copy
spins on a CPU by default, and a copy from or to pageable memory copies through a staging buffer before it returns,
so they show as busy); net_busy_pct discounts it. Findings: cpu-bottleneck as the
idle attribution measures it (the devices' idle time while the host launches or works on the CPU outside
CUDA calls, on a starved device; analysis/idle_causes.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

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
    fetch_capped,
    more_rows,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.idle_causes import IdleBasis
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest

Basis = Literal["sched", "cpu_samples", "cuda_api"]
CPU_SIDE = ("cuda_api", "os_runtime", "cpu_samples", "sched")  # every kind of data a basis is measured from
ROOT_CAUSES = {"cpu-bottleneck"}  # the idle finding this tool shows
TRIAGE = TriageRole("part", of="gpu_idle_gaps")  # ranked by triage among all the idle findings
BASIS_MEANING = {
    "sched": "time on a CPU from scheduler events (sched-in to next sched-out)",
    "cpu_samples": "CPU samples x sampling period (median sample spacing): an estimate of time on a CPU",
    "cuda_api": "time inside CUDA API calls (syncs excluded) and non-waiting OS-runtime calls: without scheduler "
                "data or samples, work outside traced calls is invisible and launches blocked on a full queue count "
                "as busy, so no cpu-bottleneck finding is drawn; capture with {sched}",
}


class Params(ScopedParams):
    basis: Annotated[Literal["auto", "sched", "cpu_samples", "cuda_api"], Field(
        description="Data to measure busy time from; auto picks sched, else cpu_samples, else cuda_api")] = "auto"
    limit: LimitParam = DEFAULT_LIMIT


class ThreadRow(BaseModel):
    pid: int
    tid: int
    name: str | None = Field(description="thread name, null when the profile did not record it")
    busy_ns: int
    busy_pct: float
    blocked_ns: int = Field(description="time inside blocking CUDA calls (syncs, synchronous or pageable copies) in "
                                        "the window")
    net_busy_pct: float = Field(description="(busy_ns - blocked_ns) / window: busy outside blocking calls, where a "
                                            "spinning wait would otherwise count as work")


class Result(Output):
    scope: Scope
    basis: Basis
    basis_meaning: str
    sample_period_ns: int | None = Field(description="estimated sampling period (basis cpu_samples)")
    thread_count: int = Field(description="threads with any busy time in the window")
    rows: list[ThreadRow] = Field(description="busiest first")
    truncated: bool
    total_rows: int
    findings: list[Finding] = []
    _idle: IdleBasis | None = PrivateAttr(None)  # what findings() reads: the window's idle attribution, not shown


PROCS = "($device IS NULL OR pid IN (SELECT pid FROM kernels WHERE device_id = $device))"
SCHED_SQL = f"""
WITH s AS (
  SELECT pid, tid, time_ns, is_sched_in, lead(time_ns) OVER w AS next_ns, lead(is_sched_in) OVER w AS next_in
  FROM sched WHERE {PROCS} WINDOW w AS (PARTITION BY pid, tid ORDER BY time_ns, is_sched_in)),
busy AS (
  SELECT pid, tid, sum(least(next_ns, $end) - greatest(time_ns, $start)) AS busy_ns FROM s
  WHERE is_sched_in AND NOT next_in AND next_ns > $start AND time_ns < $end GROUP BY pid, tid)"""

PERIOD_SQL = """
SELECT median(d)::BIGINT FROM (
  SELECT time_ns - lag(time_ns) OVER (PARTITION BY pid, tid ORDER BY time_ns) AS d FROM cpu_samples) WHERE d > 0
"""
SAMPLES_SQL = f"""
WITH busy AS (
  SELECT pid, tid, least(count(*) * $period, $end - $start) AS busy_ns FROM cpu_samples
  WHERE time_ns >= $start AND time_ns < $end AND {PROCS} GROUP BY pid, tid)"""

# Union per thread in one pass: each call adds the part of it past the furthest end of the calls before it.
API_SQL = f"""
WITH calls AS (
  SELECT pid, tid, greatest(start_ns, $start) AS start_ns, least(end_ns, $end) AS end_ns FROM (
    SELECT pid, tid, start_ns, end_ns FROM cuda_api WHERE kind <> 'sync'
    UNION ALL SELECT pid, tid, start_ns, end_ns FROM os_runtime WHERE NOT regexp_matches(name, $waits))
  WHERE end_ns > $start AND start_ns < $end AND end_ns > start_ns AND {PROCS}),
reach AS (
  SELECT pid, tid, start_ns, end_ns, max(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns
         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_end FROM calls),
busy AS (
  SELECT pid, tid, sum(greatest(0, end_ns - greatest(start_ns, coalesce(before_end, start_ns)))) AS busy_ns
  FROM reach GROUP BY pid, tid)"""

# Time inside blocking CUDA calls (syncs, and copies that block the host: synchronous ones and those from or to
# pageable memory, analysis/rules.py) per thread, as a union (nested runtime/driver records of older exports would
# otherwise count twice).
TAIL_SQL = """,
pageable AS (SELECT DISTINCT pid, correlation_id FROM memcpy WHERE 'pageable' IN (src_kind, dst_kind)),
bcalls AS (
  SELECT a.pid, a.tid, greatest(a.start_ns, $start) AS start_ns, least(a.end_ns, $end) AS end_ns FROM cuda_api a
  LEFT JOIN pageable p ON p.pid = a.pid AND p.correlation_id = a.correlation_id
  WHERE (a.kind = 'sync' OR (a.kind = 'memcpy' AND """ + rules.blocking_copy_sql("a.name", "p.pid IS NOT NULL") + """))
    AND a.end_ns > $start AND a.start_ns < $end),
breach AS (
  SELECT pid, tid, start_ns, end_ns, max(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns
         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_end FROM bcalls),
blocked AS (
  SELECT pid, tid, sum(greatest(0, end_ns - greatest(start_ns, coalesce(before_end, start_ns)))) AS blocked_ns
  FROM breach GROUP BY pid, tid)
SELECT b.pid, b.tid, t.name, b.busy_ns, coalesce(x.blocked_ns, 0), count(*) OVER () FROM busy b
LEFT JOIN (SELECT pid, tid, any_value(name) AS name FROM threads GROUP BY ALL) t ON t.pid = b.pid AND t.tid = b.tid
LEFT JOIN blocked x ON x.pid = b.pid AND x.tid = b.tid
WHERE b.busy_ns > 0 ORDER BY b.busy_ns DESC, b.pid, b.tid LIMIT $limit
"""


def basis(con: duckdb.DuckDBPyConnection, wanted: str = "auto") -> Basis:
    """The basis a call with `basis=wanted` measures from (auto: the best data the profile has)."""
    rows = dict(con.execute("SELECT data, rows FROM capabilities WHERE data IN ('sched', 'cpu_samples', "
                            "'cuda_api', 'os_runtime')").fetchall())
    available: list[Basis] = [b for b in ("sched", "cpu_samples") if rows.get(b)]
    if rows.get("cuda_api") or rows.get("os_runtime"):
        available.append("cuda_api")
    if wanted != "auto" and wanted not in available:
        raise InvalidRequest(f"this profile has no data for basis '{wanted}' (available: "
                             f"{', '.join(available) or 'none'}); use basis='auto' or one of those")
    if not available:
        raise InvalidRequest("this profile has no CPU-side data (no scheduler events, CPU samples, CUDA API or "
                             f"OS-runtime calls); re-capture with {remedy(con, CPU_SIDE)}")
    return available[0] if wanted == "auto" else wanted  # type: ignore[return-value]


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    measured = basis(con, params.basis)
    args = {**scope_args(scope), "device": params.device}
    period = None
    if measured == "sched":
        sql = SCHED_SQL
    elif measured == "cpu_samples":
        median = one_row(con.execute(PERIOD_SQL))
        period = median[0] or 0
        sql, args = SAMPLES_SQL, {**args, "period": period}
    else:
        sql, args = API_SQL, {**args, "waits": rules.WAIT_CALLS}
    del args["devices"]
    rows, truncated = fetch_capped(con, sql + TAIL_SQL, args, params.limit)
    out = [ThreadRow(pid=r[0], tid=r[1], name=r[2], busy_ns=int(r[3]), busy_pct=pct(r[3], scope.duration_ns),
                     blocked_ns=int(r[4]), net_busy_pct=pct(max(0, r[3] - r[4]), scope.duration_ns)) for r in rows]
    total = rows[0][5] if rows else 0
    meaning = BASIS_MEANING[measured].format(sched=remedy(con, ("sched",), bare=True))
    result = Result(scope=scope, basis=measured, basis_meaning=meaning, sample_period_ns=period,
                    thread_count=total, rows=out, truncated=truncated, total_rows=total)
    result._idle = idle_causes.basis(con, scope)
    return result


def findings(result: Result) -> list[Finding]:
    """The window's idle findings of ROOT_CAUSES (analysis/idle_causes.py)."""
    return result._idle.shown(ROOT_CAUSES) if result._idle else []


def render(result: Result) -> str:
    lines = [f"{result.thread_count} busy thread(s) over {ms(result.scope.duration_ns)}; basis {result.basis}: "
             f"{result.basis_meaning}"]
    lines.extend(f"{r.busy_pct:6.2f}%  {ms(r.busy_ns):>14}  (outside blocking calls {r.net_busy_pct:.1f}%)  "
                 f"pid {r.pid} tid {r.tid}  {r.name or '(unnamed)'}" for r in result.rows)
    if result.truncated:
        lines.extend(more_rows(result, result.total_rows - len(result.rows), "threads"))
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
