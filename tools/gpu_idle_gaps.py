"""Where does each GPU sit idle, for how long, and what was the host doing meanwhile?

A gap is a stretch of at least min_gap_ns inside the window (default: GPU-active) in which a device runs
no kernel, memcpy or memset (the union of their intervals), bounded by work on both sides; with
per_stream, the same per (device, stream). Per gap: the kernels before/after it on that device (stream);
host time of the device's launching threads (threads that launched its kernels) in CUDA API calls
overlapping the gap, by kind (sync, memcpy, launch incl. graph launches, other) and in OS-runtime calls;
host_activity = 'nothing traced' when those CUDA calls cover < 10% of the gap, else the kind holding
>= 50% of their time, else 'mixed'; nvtx = the 3 shortest NVTX ranges of those threads covering >= half
the gap. Gaps of similar length (consecutive lengths within 20%) on a lane form a group; it is periodic
(period_ns = median start-to-start interval) with >= 2 gaps and >= 75% of its intervals within 20% of the
median. gap_window_pct = gap time / (window x lanes). Findings only per device (not with per_stream).
Times in ns.
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.tools.common import (
    Finding,
    LimitParam,
    Scope,
    ScopedParams,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from nsightful.tools.intervals import GPU_WORK, gaps, overlaps

NOTHING_TRACED_SHARE = 0.10  # CUDA calls covering less than this of a gap: the host was elsewhere
DOMINANT_SHARE = 0.5  # one kind of call holding this share of the traced time names the activity
SIMILAR_RATIO = 1.2  # gap lengths within 20% of each other count as the same pattern
STEADY_SHARE = 0.75  # share of start-to-start intervals within 20% of the median for a periodic group
PERIODIC_MIN_GAPS = 2  # a pattern seen twice at the same length; more gaps must also keep the interval
BUBBLES_PCT = 10.0  # book gpu-bubbles: gaps worth chasing once they pass ~10% of the window
SYNC_GAP_PCT = 1.0  # idle gaps spent in host syncs above this share of the window: a sync problem
BUCKETS_MS = ((0, 1), (1, 2), (2, 5), (5, 10), (10, 50), (50, 100), (100, None))  # histogram, ms
NVTX_NAMES = 3  # innermost ranges reported per gap
GAP_ROWS = 10  # default rows: the largest gaps tell the story; totals, histogram and groups cover all
KERNEL_HORIZON_NS = 1_000_000_000  # kernel_before/after: the nearest kernel within this distance
OVERLAP_BUCKETS = 20_000  # time buckets for the gap x host-call join: bounds its rows, keeps calls in one
GC_MAX_PAUSE_NS = 100_000_000  # a collection pass takes ms to tens of ms; longer periodic gaps are other waits
HostActivity = Literal["sync", "memcpy", "launch", "other", "mixed", "nothing traced"]


class Params(ScopedParams):
    min_gap_ns: Annotated[int, Field(description="Shortest idle stretch reported, ns", ge=1000)] = 1_000_000
    per_stream: Annotated[bool, Field(description="Gaps per (device, stream) instead of per device")] = False
    limit: LimitParam = GAP_ROWS


class Gap(BaseModel):
    device: int
    stream: int | None = Field(description="stream, when per_stream; else null")
    start_ns: int
    end_ns: int
    duration_ns: int
    kernel_before: str | None
    kernel_before_end_ns: int | None
    kernel_after: str | None
    kernel_after_start_ns: int | None
    host_sync_ns: int
    host_memcpy_ns: int
    host_launch_ns: int
    host_other_ns: int
    host_os_runtime_ns: int = Field(description="time in OS-runtime calls (poll, futex, ...) on those threads")
    host_activity: HostActivity
    nvtx: list[str] = Field(description="innermost NVTX ranges covering at least half the gap")
    periodic: bool
    period_ns: int | None


class DeviceGaps(BaseModel):
    device: int
    gap_count: int
    gap_time_ns: int
    gap_window_pct: float
    largest_ns: int
    sync_gap_ns: int = Field(description="gap time whose host activity is sync")
    nothing_traced_gap_ns: int
    periodic_gap_count: int
    gc_like_gap_count: int = Field(description="periodic gaps of <= 100 ms with nothing traced on the host")
    gc_like_gap_ns: int
    gc_like_period_ns: int | None


class Bucket(BaseModel):
    label: str
    count: int
    total_ns: int


class ActivityShare(BaseModel):
    host_activity: HostActivity
    count: int
    total_ns: int


class PeriodicGroup(BaseModel):
    device: int
    stream: int | None
    count: int
    mean_duration_ns: int
    period_ns: int
    total_ns: int
    first_start_ns: int
    host_activity: HostActivity = Field(description="the most common host activity of its gaps")


class Result(BaseModel):
    scope: Scope
    min_gap_ns: int
    lanes: int = Field(description="devices (or device streams, per_stream) with work in the window")
    gap_count: int
    gap_time_ns: int
    gap_window_pct: float
    devices: list[DeviceGaps]
    histogram: list[Bucket] = Field(description="gap durations in log buckets (ms)")
    by_host_activity: list[ActivityShare]
    periodic_groups: list[PeriodicGroup]
    gaps: list[Gap] = Field(description="largest first, at most `limit`")
    truncated: bool
    note: str | None = Field(default=None, description="what the host figures cannot show here")
    findings: list[Finding] = []


SQL = "WITH " + GPU_WORK + """,
lanes AS (
  SELECT device_id, CASE WHEN $per_stream THEN coalesce(stream_id, -1) ELSE -1 END AS lane, start_ns, end_ns
  FROM gpu_work),
""" + gaps("raw_gaps", "lanes", "device_id, lane") + """,
launchers AS (
  SELECT DISTINCT device_id, pid, tid FROM kernels WHERE tid IS NOT NULL AND device_id IN (SELECT unnest($devices))),
found AS MATERIALIZED (
  SELECT row_number() OVER (ORDER BY end_ns - start_ns DESC, device_id, lane, start_ns) AS gap_id,
         device_id, lane, CASE WHEN $per_stream AND lane >= 0 THEN lane END AS stream, start_ns, end_ns,
         end_ns - start_ns AS duration_ns
  FROM raw_gaps WHERE end_ns - start_ns >= $min_gap),
calls AS (
  SELECT l.device_id, CASE WHEN a.kind IN ('sync', 'memcpy', 'launch') THEN a.kind WHEN a.kind = 'graph'
         THEN 'launch' ELSE 'other' END AS kind, a.start_ns, a.end_ns
  FROM cuda_api a JOIN launchers l ON a.pid = l.pid AND a.tid = l.tid
  WHERE a.end_ns > $start AND a.start_ns < $end
  UNION ALL
  SELECT l.device_id, 'os', o.start_ns, o.end_ns FROM os_runtime o JOIN launchers l ON o.pid = l.pid AND o.tid = l.tid
  WHERE o.end_ns > $start AND o.start_ns < $end),
probes AS (SELECT gap_id AS probe_id, device_id, start_ns, end_ns FROM found),
""" + overlaps("touch", "probes", "calls", "device_id", "kind") + """,
host AS (
  SELECT probe_id AS gap_id, sum(ns) FILTER (WHERE kind = 'sync') AS sync_ns,
         sum(ns) FILTER (WHERE kind = 'memcpy') AS memcpy_ns, sum(ns) FILTER (WHERE kind = 'launch') AS launch_ns,
         sum(ns) FILTER (WHERE kind = 'other') AS other_ns, sum(ns) FILTER (WHERE kind = 'os') AS os_ns,
         sum(ns) FILTER (WHERE kind <> 'os') AS traced_ns
  FROM (SELECT probe_id, kind, end_ns - start_ns AS ns FROM touch) GROUP BY probe_id),
classified AS (
  SELECT f.*, coalesce(sync_ns, 0) AS sync_ns, coalesce(memcpy_ns, 0) AS memcpy_ns,
         coalesce(launch_ns, 0) AS launch_ns, coalesce(other_ns, 0) AS other_ns, coalesce(os_ns, 0) AS os_ns,
         CASE WHEN coalesce(traced_ns, 0) < $nothing_share * duration_ns THEN 'nothing traced'
              WHEN sync_ns >= $dominant * traced_ns THEN 'sync'
              WHEN memcpy_ns >= $dominant * traced_ns THEN 'memcpy'
              WHEN launch_ns >= $dominant * traced_ns THEN 'launch'
              WHEN other_ns >= $dominant * traced_ns THEN 'other' ELSE 'mixed' END AS activity
  FROM found f LEFT JOIN host h USING (gap_id)),
chained AS (
  SELECT *, sum(opens) OVER (PARTITION BY device_id, lane ORDER BY duration_ns, gap_id ROWS UNBOUNDED PRECEDING) AS grp
  FROM (SELECT *, coalesce(duration_ns > $similar * lag(duration_ns) OVER (
                    PARTITION BY device_id, lane ORDER BY duration_ns, gap_id), true)::INTEGER AS opens
        FROM classified)),
spaced AS (
  SELECT *, start_ns - lag(start_ns) OVER (PARTITION BY device_id, lane, grp ORDER BY start_ns) AS interval_ns
  FROM chained),
grouped AS (
  SELECT device_id, lane, grp, count(*) AS n, median(interval_ns)::BIGINT AS period_ns FROM spaced GROUP BY ALL),
steady AS (
  SELECT device_id, lane, grp, any_value(g.n) AS n, any_value(g.period_ns) AS period_ns,
         count(s.interval_ns) AS intervals,
         count(*) FILTER (WHERE abs(s.interval_ns - g.period_ns) <= ($similar - 1) * g.period_ns) AS steady
  FROM spaced s JOIN grouped g USING (device_id, lane, grp) GROUP BY ALL),
gapset AS MATERIALIZED (
  SELECT *, periodic AND activity = 'nothing traced' AND avg(duration_ns) OVER (PARTITION BY device_id, lane, grp)
            <= $gc_max AS gc_like
  FROM (SELECT s.*, coalesce(st.n >= $min_gaps AND st.steady >= $steady_share * st.intervals, false) AS periodic,
               st.period_ns
        FROM spaced s JOIN steady st USING (device_id, lane, grp))),
top AS (SELECT * FROM gapset ORDER BY gap_id LIMIT $limit),
klanes AS (
  SELECT device_id, CASE WHEN $per_stream THEN coalesce(stream_id, -1) ELSE -1 END AS lane, short_name,
         start_ns, end_ns
  FROM kernels WHERE device_id IN (SELECT device_id FROM top)),
before AS (
  SELECT t.gap_id, arg_max(k.short_name, k.end_ns) AS short_name, max(k.end_ns) AS end_ns
  FROM (SELECT *, unnest([start_ns // $horizon - 1, start_ns // $horizon]) AS bucket FROM top) t
  JOIN (SELECT *, end_ns // $horizon AS bucket FROM klanes) k
    ON k.device_id = t.device_id AND k.lane = t.lane AND k.bucket = t.bucket AND k.end_ns <= t.start_ns
  GROUP BY t.gap_id),
after AS (
  SELECT t.gap_id, arg_min(k.short_name, k.start_ns) AS short_name, min(k.start_ns) AS start_ns
  FROM (SELECT *, unnest([end_ns // $horizon, end_ns // $horizon + 1]) AS bucket FROM top) t
  JOIN (SELECT *, start_ns // $horizon AS bucket FROM klanes) k
    ON k.device_id = t.device_id AND k.lane = t.lane AND k.bucket = t.bucket AND k.start_ns >= t.end_ns
  GROUP BY t.gap_id),
ranges AS (
  SELECT t.gap_id, list(n.text ORDER BY n.duration_ns, n.text)[1:$nvtx_names] AS names
  FROM top t JOIN launchers l ON l.device_id = t.device_id
  JOIN nvtx n ON n.pid = l.pid AND n.tid = l.tid AND n.duration_ns >= $min_gap // 2
   AND least(n.end_ns, t.end_ns) - greatest(n.start_ns, t.start_ns) >= t.duration_ns / 2
  GROUP BY t.gap_id),
lane_counts AS (SELECT device_id, count(DISTINCT lane) AS lanes FROM lanes GROUP BY device_id)
SELECT
  (SELECT coalesce(sum(lanes), 0) FROM lane_counts), (SELECT count(*) FROM gapset), (SELECT count(*) FROM launchers),
  (SELECT list(d ORDER BY d.device) FROM (
     SELECT {device: l.device_id, lanes: any_value(l.lanes), gap_count: count(g.gap_id),
             gap_time_ns: coalesce(sum(g.duration_ns), 0), largest_ns: coalesce(max(g.duration_ns), 0),
             sync_gap_ns: coalesce(sum(g.duration_ns) FILTER (WHERE g.activity = 'sync'), 0),
             nothing_traced_gap_ns: coalesce(sum(g.duration_ns) FILTER (WHERE g.activity = 'nothing traced'), 0),
             periodic_gap_count: count(*) FILTER (WHERE g.periodic),
             gc_like_gap_count: count(*) FILTER (WHERE g.gc_like),
             gc_like_gap_ns: coalesce(sum(g.duration_ns) FILTER (WHERE g.gc_like), 0),
             gc_like_period_ns: median(g.period_ns) FILTER (WHERE g.gc_like)::BIGINT} AS d
     FROM lane_counts l LEFT JOIN gapset g USING (device_id) GROUP BY l.device_id)),
  (SELECT list({bucket: bucket, count: n, total_ns: total} ORDER BY bucket) FROM (
     SELECT len(list_filter($bounds, x -> x <= duration_ns)) AS bucket, count(*) AS n, sum(duration_ns) AS total
     FROM gapset GROUP BY bucket)),
  (SELECT list({host_activity: activity, count: n, total_ns: total} ORDER BY total DESC, activity) FROM (
     SELECT activity, count(*) AS n, sum(duration_ns) AS total FROM gapset GROUP BY activity)),
  (SELECT list(g ORDER BY g.total_ns DESC, g.device, g.stream, g.first_start_ns)[1:$limit] FROM (
     SELECT {device: device_id, stream: any_value(stream), count: count(*), mean_duration_ns: avg(duration_ns)::BIGINT,
             period_ns: any_value(period_ns), total_ns: sum(duration_ns), first_start_ns: min(start_ns),
             host_activity: mode(activity)} AS g
     FROM gapset WHERE periodic GROUP BY device_id, lane, grp)),
  (SELECT list({device: t.device_id, stream: t.stream, start_ns: t.start_ns, end_ns: t.end_ns,
                duration_ns: t.duration_ns, kernel_before: b.short_name, kernel_before_end_ns: b.end_ns,
                kernel_after: a.short_name, kernel_after_start_ns: a.start_ns, host_sync_ns: t.sync_ns,
                host_memcpy_ns: t.memcpy_ns, host_launch_ns: t.launch_ns, host_other_ns: t.other_ns,
                host_os_runtime_ns: t.os_ns, host_activity: t.activity, nvtx: coalesce(r.names, []),
                periodic: t.periodic, period_ns: CASE WHEN t.periodic THEN t.period_ns END} ORDER BY t.gap_id)
   FROM top t LEFT JOIN before b USING (gap_id) LEFT JOIN after a USING (gap_id) LEFT JOIN ranges r USING (gap_id))
"""


def _args(params: Params, scope: Scope) -> dict[str, object]:
    return {**scope_args(scope), "per_stream": params.per_stream, "min_gap": params.min_gap_ns, "limit": params.limit,
            "nothing_share": NOTHING_TRACED_SHARE, "dominant": DOMINANT_SHARE, "similar": SIMILAR_RATIO,
            "steady_share": STEADY_SHARE, "min_gaps": PERIODIC_MIN_GAPS, "nvtx_names": NVTX_NAMES,
            "horizon": KERNEL_HORIZON_NS, "gc_max": GC_MAX_PAUSE_NS,
            "bucket_ns": max(params.min_gap_ns, scope.duration_ns // OVERLAP_BUCKETS),
            "bounds": [lo * 1_000_000 for lo, _ in BUCKETS_MS[1:]]}


def _bucket(row: dict) -> Bucket:
    lo, hi = BUCKETS_MS[row.pop("bucket")]
    return Bucket(label=f">={lo} ms" if hi is None else f"{lo}-{hi} ms", **row)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params, default="gpu_active")
    lanes, count, launchers, devs, hist, acts, groups, rows = con.execute(SQL, _args(params, scope)).fetchone()
    devices = [DeviceGaps(**d, gap_window_pct=pct(d["gap_time_ns"], scope.duration_ns * d.pop("lanes")))
               for d in devs or []]
    total = sum(d.gap_time_ns for d in devices)
    note = None if launchers else ("no kernel in scope has a traced launch call, so host activity reads 'nothing "
                                   "traced'; capture with `nsys profile --trace=cuda` to see what the host did")
    result = Result(
        scope=scope, min_gap_ns=params.min_gap_ns, lanes=lanes, gap_count=count, gap_time_ns=total,
        gap_window_pct=pct(total, scope.duration_ns * lanes), devices=devices,
        histogram=[_bucket(h) for h in hist or []], by_host_activity=[ActivityShare(**a) for a in acts or []],
        periodic_groups=[PeriodicGroup(**g) for g in groups or []], gaps=[Gap(**r) for r in rows or []],
        truncated=count > params.limit, note=note)
    result.findings = [] if params.per_stream else findings(result)
    return result


def findings(result: Result) -> list[Finding]:
    """Per device: gpu-bubbles (gap share), excessive-synchronization (gaps inside host syncs), gc-pauses
    (periodic gaps of <= 100 ms with nothing traced on the host)."""
    out = []
    width = result.scope.duration_ns
    for d in result.devices:
        if d.gap_window_pct >= BUBBLES_PCT:
            out.append(Finding(
                root_cause="gpu-bubbles", severity="high" if d.gap_window_pct >= 3 * BUBBLES_PCT else "medium",
                title=f"device {d.device} idles {d.gap_window_pct:.1f}% of the window in {d.gap_count} gaps "
                      f">= {ms(result.min_gap_ns)}",
                evidence={"gap_count": d.gap_count, "gap_time_ns": d.gap_time_ns, "gap_window_pct": d.gap_window_pct,
                          "largest_ns": d.largest_ns}, time_at_stake_ns=d.gap_time_ns, device=d.device))
        if d.sync_gap_ns and pct(d.sync_gap_ns, width) >= SYNC_GAP_PCT:
            out.append(Finding(
                root_cause="excessive-synchronization", severity="medium",
                title=f"device {d.device} idles {ms(d.sync_gap_ns)} while its host threads wait in sync calls",
                evidence={"sync_gap_ns": d.sync_gap_ns, "sync_gap_window_pct": pct(d.sync_gap_ns, width)},
                time_at_stake_ns=d.sync_gap_ns, device=d.device))
        if d.gc_like_gap_count >= PERIODIC_MIN_GAPS:
            out.append(Finding(
                root_cause="gc-pauses", severity="medium" if d.gc_like_gap_count > PERIODIC_MIN_GAPS else "low",
                title=f"device {d.device}: {d.gc_like_gap_count} periodic idle gaps ({ms(d.gc_like_gap_ns)}) with "
                      "no CUDA call on the host: GC-like pauses or other untraced host work",
                evidence={"gc_like_gap_count": d.gc_like_gap_count, "gc_like_gap_ns": d.gc_like_gap_ns,
                          "gc_like_period_ns": d.gc_like_period_ns or 0},
                time_at_stake_ns=d.gc_like_gap_ns, device=d.device))
    return out


def render(result: Result) -> str:
    s = result.scope
    lines = [f"{result.gap_count} idle gaps >= {ms(result.min_gap_ns)} over {ms(s.duration_ns)} ({s.window_basis}): "
             f"{ms(result.gap_time_ns)} idle, {result.gap_window_pct:.1f}% of {result.lanes} lane(s)"]
    lines.extend(f"device {d.device}: {d.gap_count} gaps, {ms(d.gap_time_ns)} ({d.gap_window_pct:.1f}%), largest "
                 f"{ms(d.largest_ns)}" for d in result.devices)
    lines.append("histogram: " + ", ".join(f"{b.label}: {b.count}" for b in result.histogram))
    lines.append("host during gaps: " + ", ".join(f"{a.host_activity} {a.count} ({ms(a.total_ns)})"
                                                  for a in result.by_host_activity))
    lines.extend(f"periodic: dev {g.device} {g.count} x ~{ms(g.mean_duration_ns)} every {ms(g.period_ns)}, host "
                 f"{g.host_activity}" for g in result.periodic_groups)
    for g in result.gaps:
        where = f"dev {g.device}" + (f" stream {g.stream}" if g.stream is not None else "")
        lines.append(f"{ms(g.duration_ns):>14} {where} at {g.start_ns}: host {g.host_activity}"
                     f"{' (periodic)' if g.periodic else ''}; {g.kernel_before or '-'} -> {g.kernel_after or '-'}"[:200]
                     + (f"; nvtx {' < '.join(g.nvtx)}" if g.nvtx else ""))
    if result.truncated:
        lines.append(f"... {result.gap_count - len(result.gaps)} more gaps: raise `limit` to see them")
    if result.note:
        lines.append(f"note: {result.note}")
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
