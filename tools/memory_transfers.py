"""How much data moves between host and devices, how fast, from which memory, and does it stall the GPU?

Copies (memcpy rows) of the devices in scope whose start lies in the window, per direction (H2D, D2H,
D2D, P2P, ...; per device too with per_device). time_ns sums copy durations; bandwidth_gb_per_s = bytes /
time_ns; window_pct = time_ns / (window x devices). Host memory kind: pageable when either side is
pageable, else pinned when either side is pinned. exposed_time_ns = copy time during which the copying
device ran no kernel (copy interval minus the union of that device's kernels). Synchronous copy APIs:
traced copy calls whose name lacks 'Async' (cudaMemcpy, ...): distinct calls and their host duration.
Small D2H: D2H copies of <= 1 KiB; blocking when the call is synchronous, or asynchronous and followed by
a sync call on the same thread starting within 100 us after it returns (the .item() pattern);
blocked_ns = the copy call's duration, plus that sync's for an asynchronous copy.
"""

from __future__ import annotations

from typing import Annotated

import duckdb
from pydantic import BaseModel, Field

from nsightful.tools.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Scope,
    ScopedParams,
    fetch_capped,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from nsightful.tools.intervals import gaps, overlaps

SMALL_D2H_BYTES = 1024  # a scalar or a handful of values read back: .item(), .cpu() of a metric
FOLLOW_NS = 100_000  # a sync starting this soon after the copy call belongs to the same host read
SMALL_D2H_MIN = 3  # recurring, not a one-off read at the end of the run
PAGEABLE_MIN_COUNT = 3  # recurring pageable copies, not a one-time upload
PAGEABLE_MIN_BYTES = 1 << 20  # ... moving enough data for staging to matter
H2D_WINDOW_PCT = 5.0  # book excessive-h2d-transfers: H2D time above ~5% of the time
EXPOSED_SHARE = 0.5  # most of the H2D time with no kernel running: the copy is on the critical path
HOST_SIDE = ("H2D", "D2H", "H2H", "H2A", "A2H", "UVM_H2D", "UVM_D2H")


class Params(ScopedParams):
    per_device: Annotated[bool, Field(description="One row per (direction, device) instead of per direction")] = False
    limit: LimitParam = DEFAULT_LIMIT


class DirectionRow(BaseModel):
    direction: str
    device: int | None = Field(description="device, when per_device; else null (all devices in scope)")
    count: int
    bytes: int
    time_ns: int
    bandwidth_gb_per_s: float | None
    window_pct: float
    pageable_count: int
    pageable_bytes: int
    pageable_time_ns: int
    pageable_bandwidth_gb_per_s: float | None
    pinned_count: int
    pinned_bytes: int
    pinned_time_ns: int
    pinned_bandwidth_gb_per_s: float | None
    exposed_time_ns: int = Field(description="copy time with no kernel running on the copying device")
    exposed_pct: float


class Result(BaseModel):
    scope: Scope
    copy_count: int
    copy_bytes: int
    copy_time_ns: int
    rows: list[DirectionRow]
    truncated: bool
    total_rows: int
    sync_copy_calls: int = Field(description="traced copy calls without 'Async' in the name")
    sync_copy_api_ns: int
    small_d2h_count: int = Field(description=f"D2H copies of <= {SMALL_D2H_BYTES} bytes")
    small_d2h_blocking: int = Field(description="those whose call blocked the host (synchronous or followed by a sync)")
    small_d2h_blocked_ns: int = Field(description="host time in those copy calls and their syncs")
    findings: list[Finding] = []


COPIES = """
WITH c AS (
  SELECT row_number() OVER () AS copy_id, device_id, pid, correlation_id, direction, bytes, start_ns, end_ns,
         duration_ns, api_name,
         CASE WHEN 'pageable' IN (src_kind, dst_kind) THEN 'pageable'
              WHEN 'pinned' IN (src_kind, dst_kind) THEN 'pinned' END AS host_kind
  FROM memcpy WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end)"""

DIRECTIONS_SQL = COPIES + """,
horizon AS (SELECT greatest($end, max(end_ns)) AS hi FROM c),
kwork AS (
  SELECT device_id, start_ns, end_ns FROM kernels
  WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND end_ns > start_ns
    AND start_ns < (SELECT hi FROM horizon)
  UNION ALL SELECT unnest($devices), $start, $start
  UNION ALL SELECT unnest($devices), hi, hi FROM horizon),
""" + gaps("kernel_idle", "kwork", "device_id") + """,
probes AS (SELECT copy_id AS probe_id, device_id, start_ns, end_ns FROM c),
""" + overlaps("hits", "probes", "kernel_idle", "device_id") + """,
exposed AS (
  SELECT c.*, coalesce(h.exposed_ns, 0) AS exposed_ns FROM c
  LEFT JOIN (SELECT probe_id AS copy_id, sum(end_ns - start_ns) AS exposed_ns FROM hits GROUP BY ALL) h USING (copy_id))
SELECT direction, CASE WHEN $per_device THEN device_id END AS device, count(*), sum(bytes), sum(duration_ns),
       count(*) FILTER (WHERE host_kind = 'pageable'), coalesce(sum(bytes) FILTER (WHERE host_kind = 'pageable'), 0),
       coalesce(sum(duration_ns) FILTER (WHERE host_kind = 'pageable'), 0),
       count(*) FILTER (WHERE host_kind = 'pinned'), coalesce(sum(bytes) FILTER (WHERE host_kind = 'pinned'), 0),
       coalesce(sum(duration_ns) FILTER (WHERE host_kind = 'pinned'), 0), sum(exposed_ns),
       count(*) OVER () AS total_rows
FROM exposed GROUP BY ALL ORDER BY sum(duration_ns) DESC, direction, device LIMIT $limit
"""

# Buckets of about one copy length (at least 1/100,000 of the window) keep the copy x idle-stretch join small.
BUCKET_SQL = """
SELECT greatest(1000, ($end - $start) // 100000, coalesce(avg(duration_ns), 0))::BIGINT FROM memcpy
WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end
"""

SYNC_COPY_SQL = COPIES + """
SELECT count(*), coalesce(sum(duration_ns), 0) FROM (
  SELECT DISTINCT a.pid, a.correlation_id, a.duration_ns FROM c
  JOIN cuda_api a ON a.pid = c.pid AND a.correlation_id = c.correlation_id AND a.kind = 'memcpy'
  WHERE c.api_name NOT LIKE '%Async%')
"""

SMALL_D2H_SQL = COPIES + """,
small AS (
  SELECT c.copy_id, a.pid, a.tid, a.name, a.end_ns, a.duration_ns FROM c
  LEFT JOIN cuda_api a ON a.pid = c.pid AND a.correlation_id = c.correlation_id AND a.kind = 'memcpy'
  WHERE c.direction = 'D2H' AND c.bytes <= $small_bytes),
syncs AS (
  SELECT a.pid, a.tid, a.start_ns, a.duration_ns FROM cuda_api a
  JOIN (SELECT DISTINCT pid, tid FROM small) t ON a.pid = t.pid AND a.tid = t.tid WHERE a.kind = 'sync'),
followed AS (
  SELECT s.*, coalesce(y.start_ns - s.end_ns <= $follow, false) AS synced, y.duration_ns AS sync_ns
  FROM small s ASOF LEFT JOIN syncs y ON y.pid = s.pid AND y.tid = s.tid AND y.start_ns >= s.end_ns)
SELECT count(*), count(*) FILTER (WHERE blocking),
       coalesce(sum(duration_ns + CASE WHEN synced AND is_async THEN sync_ns ELSE 0 END) FILTER (WHERE blocking), 0)
FROM (SELECT *, name LIKE '%Async%' AS is_async, name IS NOT NULL AND (name NOT LIKE '%Async%' OR synced) AS blocking
      FROM followed)
"""


def _bandwidth(nbytes: int, ns: int) -> float | None:
    return round(nbytes / ns, 3) if ns else None


def _row(r: tuple, capacity: int) -> DirectionRow:
    direction, device, n, nbytes, ns, pg_n, pg_b, pg_ns, pin_n, pin_b, pin_ns, exposed = r[:12]
    return DirectionRow(
        direction=direction, device=device, count=n, bytes=int(nbytes), time_ns=int(ns),
        bandwidth_gb_per_s=_bandwidth(nbytes, ns), window_pct=pct(ns, capacity), pageable_count=pg_n,
        pageable_bytes=int(pg_b), pageable_time_ns=int(pg_ns), pageable_bandwidth_gb_per_s=_bandwidth(pg_b, pg_ns),
        pinned_count=pin_n, pinned_bytes=int(pin_b), pinned_time_ns=int(pin_ns),
        pinned_bandwidth_gb_per_s=_bandwidth(pin_b, pin_ns), exposed_time_ns=int(exposed),
        exposed_pct=pct(exposed, ns))


def small_d2h(con: duckdb.DuckDBPyConnection, scope: Scope) -> tuple[int, int, int]:
    """(small D2H copies, blocking ones, host ns blocked) in scope; shared with sync_analysis."""
    args = {**scope_args(scope), "small_bytes": SMALL_D2H_BYTES, "follow": FOLLOW_NS}
    count, blocking, blocked = con.execute(SMALL_D2H_SQL, args).fetchone()
    return count, blocking, int(blocked)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    args = scope_args(scope)
    bucket = con.execute(BUCKET_SQL, args).fetchone()[0]
    rows, truncated = fetch_capped(con, DIRECTIONS_SQL, {**args, "per_device": params.per_device, "bucket_ns": bucket},
                                   params.limit)
    count, nbytes, ns = con.execute(COPIES + " SELECT count(*), coalesce(sum(bytes), 0), "
                                    "coalesce(sum(duration_ns), 0) FROM c", args).fetchone()
    sync_calls, sync_ns = con.execute(SYNC_COPY_SQL, args).fetchone()
    small, blocking, blocked = small_d2h(con, scope)
    per_row_devices = 1 if params.per_device else max(len(scope.devices), 1)
    result = Result(
        scope=scope, copy_count=count, copy_bytes=int(nbytes), copy_time_ns=int(ns),
        rows=[_row(r, scope.duration_ns * per_row_devices) for r in rows], truncated=truncated,
        total_rows=rows[0][12] if rows else 0, sync_copy_calls=sync_calls, sync_copy_api_ns=int(sync_ns),
        small_d2h_count=small, small_d2h_blocking=blocking, small_d2h_blocked_ns=blocked)
    result.findings = findings(result)
    return result


def _pageable_cost(row: DirectionRow) -> int:
    """Pageable copy time minus what the same bytes take at the pinned bandwidth (half when unknown)."""
    pinned = row.pinned_bandwidth_gb_per_s
    if pinned and row.pageable_bandwidth_gb_per_s and pinned > row.pageable_bandwidth_gb_per_s:
        return int(row.pageable_time_ns - row.pageable_bytes / pinned)
    return row.pageable_time_ns // 2


def findings(result: Result) -> list[Finding]:
    """Per row: pageable-host-memory (recurring pageable copies), excessive-h2d-transfers (H2D time above
    5% of the window); per scope: blocking-d2h-sync (recurring small blocking D2H copies)."""
    only = result.scope.devices[0] if len(result.scope.devices) == 1 else None
    out = []
    for r in result.rows:
        device = r.device if r.device is not None else only
        recurring = r.pageable_count >= PAGEABLE_MIN_COUNT and r.pageable_bytes >= PAGEABLE_MIN_BYTES
        if r.direction in HOST_SIDE and recurring:
            out.append(Finding(
                root_cause="pageable-host-memory", severity="medium",
                title=f"{r.pageable_count} {r.direction} copies ({r.pageable_bytes / 2**20:,.1f} MiB) from pageable "
                      f"memory at {r.pageable_bandwidth_gb_per_s} GB/s "
                      f"(pinned: {r.pinned_bandwidth_gb_per_s or '-'} GB/s)",
                evidence={"pageable_count": r.pageable_count, "pageable_bytes": r.pageable_bytes,
                          "pageable_time_ns": r.pageable_time_ns,
                          "pageable_bandwidth_gb_per_s": r.pageable_bandwidth_gb_per_s or 0,
                          "pinned_bandwidth_gb_per_s": r.pinned_bandwidth_gb_per_s or 0},
                time_at_stake_ns=_pageable_cost(r), device=device))
        if r.direction == "H2D" and r.window_pct >= H2D_WINDOW_PCT:
            out.append(Finding(
                root_cause="excessive-h2d-transfers",
                severity="high" if r.exposed_pct >= 100 * EXPOSED_SHARE else "medium",
                title=f"H2D copies take {r.window_pct:.1f}% of the window, {r.exposed_pct:.0f}% of it with no "
                      "kernel running",
                evidence={"count": r.count, "bytes": r.bytes, "time_ns": r.time_ns, "window_pct": r.window_pct,
                          "exposed_time_ns": r.exposed_time_ns},
                time_at_stake_ns=r.exposed_time_ns, device=device))
    if result.small_d2h_blocking >= SMALL_D2H_MIN:
        out.append(Finding(
            root_cause="blocking-d2h-sync", severity="medium",
            title=f"{result.small_d2h_blocking} small D2H copies blocked the host for "
                  f"{ms(result.small_d2h_blocked_ns)}",
            evidence={"small_d2h_blocking": result.small_d2h_blocking,
                      "small_d2h_blocked_ns": result.small_d2h_blocked_ns, "small_d2h_count": result.small_d2h_count},
            time_at_stake_ns=result.small_d2h_blocked_ns, device=only))
    return out


def render(result: Result) -> str:
    lines = [f"{result.copy_count:,} copies, {result.copy_bytes / 2**20:,.1f} MiB, {ms(result.copy_time_ns)} on "
             f"device(s) {result.scope.devices}"]
    for r in result.rows:
        where = f" [dev {r.device}]" if r.device is not None else ""
        bw = "-" if r.bandwidth_gb_per_s is None else f"{r.bandwidth_gb_per_s:.2f}"
        lines.append(f"{r.direction:>8}{where}: x{r.count:<7,} {r.bytes / 2**20:12,.1f} MiB {ms(r.time_ns):>14} "
                     f"{bw} GB/s, {r.window_pct:.2f}% of window; pageable {r.pageable_count} / pinned "
                     f"{r.pinned_count}; no kernel running {r.exposed_pct:.0f}%")
    if result.truncated:
        lines.append(f"... {result.total_rows - len(result.rows)} more rows: raise `limit` to see them")
    lines.append(f"synchronous copy calls: {result.sync_copy_calls} ({ms(result.sync_copy_api_ns)}); small D2H: "
                 f"{result.small_d2h_count}, {result.small_d2h_blocking} blocking ({ms(result.small_d2h_blocked_ns)})")
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
