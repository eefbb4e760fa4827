"""How much time goes to NCCL communication, how much of it is hidden under compute, and are ranks balanced?

NCCL kernels (kernels.category = 'nccl') of the devices in scope, clipped to the window (default:
GPU-active). Rows per (collective type, stream) over those devices: count, total_ns (sum of clipped
durations), mean_ns, window_pct = total_ns / (window x devices in scope). overlapped_ns = time of each
NCCL kernel during which its device also ran a non-NCCL kernel (intersection with the union of the
other kernels' intervals on that device); overlapped_pct = overlapped_ns / total_ns; exposed_ns =
total_ns - overlapped_ns (communication not hidden by compute). devices: the same per device;
spread_ns = max - min of per-device NCCL time, spread_pct = spread / mean; the device with the least
NCCL time is the likely straggler (the late rank waits least). nccl_on_compute_stream lists streams that
carry both NCCL and non-NCCL kernels. Times in ns.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from nsightful.tools.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Scope,
    ScopedParams,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from nsightful.tools.intervals import covered, overlaps

OVERLAP_MIN_PCT = 50.0  # book nccl-serialization: overlapped_pct well below 50% means collectives take turns
EXPOSED_MIN_PCT = 10.0  # ... and only when the exposed time is a sizeable share of the window
STRAGGLER_SPREAD_PCT = 25.0  # per-device NCCL time differing this much from the mean: one rank is late
STRAGGLER_HIGH_PCT = 10.0  # the waiting costs the other ranks a tenth of the window or more
NCCL_SHARE_PCT = 20.0  # book compute-communication-imbalance: NCCL above 20% of the window is a red flag
BUCKET_NS = 1_000_000  # overlap join buckets: NCCL kernels span a few, most compute kernels fit in one


NO_NCCL = ("no NCCL kernels in this window (a single-GPU run, or communication not captured: trace every rank "
           "with `nsys profile --trace=cuda,nvtx`)")


class Params(ScopedParams):
    limit: LimitParam = DEFAULT_LIMIT


class CollectiveRow(BaseModel):
    collective: str
    stream: int | None
    devices: int = Field(description="devices on which this (collective, stream) ran")
    count: int
    total_ns: int
    mean_ns: float
    window_pct: float
    overlapped_ns: int
    overlapped_pct: float
    exposed_ns: int


class DeviceNccl(BaseModel):
    device: int
    count: int
    nccl_ns: int
    mean_ns: float
    window_pct: float
    overlapped_ns: int
    exposed_ns: int


class SharedStream(BaseModel):
    device: int
    stream: int | None
    nccl_kernels: int
    compute_kernels: int = Field(description="non-NCCL kernels on the same stream")


class Result(BaseModel):
    scope: Scope
    has_nccl: bool
    note: str | None = Field(description="why figures are empty, when they are")
    nccl_count: int
    nccl_ns: int
    window_pct: float = Field(description="nccl_ns / (window x devices in scope)")
    overlapped_ns: int
    overlapped_pct: float
    exposed_ns: int
    rows: list[CollectiveRow]
    truncated: bool
    total_rows: int
    devices: list[DeviceNccl]
    spread_ns: int = Field(description="max - min per-device NCCL time (0 with one device)")
    spread_pct: float = Field(description="spread_ns / mean per-device NCCL time")
    least_nccl_device: int | None = Field(description="device with the least NCCL time: the likely late rank")
    nccl_on_compute_stream: list[SharedStream]
    findings: list[Finding] = []


# Per NCCL kernel: the pieces of other kernels of its device that overlap it (bucketed hash join, see
# intervals.overlaps), then their union length (intervals.covered).
SQL = """
WITH k AS (
  SELECT device_id, stream_id, category = 'nccl' AS is_nccl, coalesce(nccl_collective, 'other') AS coll,
         greatest(start_ns, $start) AS start_ns, least(end_ns, $end) AS end_ns
  FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end
    AND end_ns > start_ns),
probes AS (SELECT row_number() OVER () AS probe_id, device_id, stream_id, coll, start_ns, end_ns FROM k WHERE is_nccl),
others AS (SELECT device_id, start_ns, end_ns FROM k WHERE NOT is_nccl
           AND device_id IN (SELECT device_id FROM probes)),
""" + overlaps("pieces", "probes", "others", "device_id") + ",\n" + covered("covered", "pieces") + """,
n AS (SELECT p.*, p.end_ns - p.start_ns AS dur, coalesce(c.ns, 0) AS covered
      FROM probes p LEFT JOIN covered c USING (probe_id))
SELECT grouping(device_id), coll, stream_id, device_id, count(DISTINCT device_id), count(*), sum(dur), avg(dur),
       sum(covered)
FROM n GROUP BY GROUPING SETS ((coll, stream_id), (device_id)) ORDER BY 1, 4, 7 DESC, 2, 3
"""

SHARED_SQL = """
SELECT device_id, stream_id, count(*) FILTER (WHERE category = 'nccl'), count(*) FILTER (WHERE category <> 'nccl')
FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end
GROUP BY ALL HAVING count(*) FILTER (WHERE category = 'nccl') > 0 AND count(*) FILTER (WHERE category <> 'nccl') > 0
ORDER BY ALL
"""


def _spread(devices: list[DeviceNccl], scope: Scope) -> tuple[int, float, int | None]:
    if len(scope.devices) < 2 or not devices:
        return 0, 0.0, None
    totals = {d: 0 for d in scope.devices} | {d.device: d.nccl_ns for d in devices}
    spread = max(totals.values()) - min(totals.values())
    return spread, pct(spread, sum(totals.values()) / len(totals)), min(totals, key=lambda d: (totals[d], d))


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params, default="gpu_active")
    args = scope_args(scope)
    capacity = scope.duration_ns * max(len(scope.devices), 1)
    groups = con.execute(SQL, {**args, "bucket_ns": BUCKET_NS}).fetchall()
    rows = [CollectiveRow(collective=r[1], stream=r[2], devices=r[4], count=r[5], total_ns=int(r[6]),
                          mean_ns=round(r[7], 1), window_pct=pct(r[6], capacity), overlapped_ns=int(r[8]),
                          overlapped_pct=pct(r[8], r[6]), exposed_ns=int(r[6] - r[8])) for r in groups if r[0] == 1]
    devices = [DeviceNccl(device=r[3], count=r[5], nccl_ns=int(r[6]), mean_ns=round(r[7], 1),
                          window_pct=pct(r[6], scope.duration_ns), overlapped_ns=int(r[8]), exposed_ns=int(r[6] - r[8]))
               for r in groups if r[0] == 0]
    total, covered = sum(d.nccl_ns for d in devices), sum(d.overlapped_ns for d in devices)
    spread, spread_pct, least = _spread(devices, scope)
    result = Result(
        scope=scope, has_nccl=bool(devices), note=None if devices else NO_NCCL,
        nccl_count=sum(d.count for d in devices), nccl_ns=total, window_pct=pct(total, capacity),
        overlapped_ns=covered, overlapped_pct=pct(covered, total), exposed_ns=total - covered,
        rows=rows[:params.limit], truncated=len(rows) > params.limit, total_rows=len(rows), devices=devices,
        spread_ns=spread, spread_pct=spread_pct, least_nccl_device=least,
        nccl_on_compute_stream=[SharedStream(device=r[0], stream=r[1], nccl_kernels=r[2], compute_kernels=r[3])
                                for r in con.execute(SHARED_SQL, args).fetchall()])
    result.findings = findings(result)
    return result


def findings(result: Result) -> list[Finding]:
    if not result.has_nccl:
        return []
    straggler = _straggler(result)
    return [*_serialization(result, late_rank=straggler is not None), *_shared(result),
            *([straggler] if straggler else _imbalance(result))]  # a fixed late rank explains a high share


def _serialization(result: Result, late_rank: bool) -> list[Finding]:
    """Judged on the late rank when there is one: the other ranks' exposed time is waiting for it."""
    judged = [d for d in result.devices if not late_rank or d.device == result.least_nccl_device]
    total, exposed = sum(d.nccl_ns for d in judged), sum(d.exposed_ns for d in judged)
    overlapped_pct = pct(total - exposed, total)
    exposed_pct = pct(exposed, result.scope.duration_ns * len(judged))
    if overlapped_pct >= OVERLAP_MIN_PCT or exposed_pct < EXPOSED_MIN_PCT:
        return []
    return [Finding(
        root_cause="nccl-serialization", severity="high" if exposed_pct >= NCCL_SHARE_PCT else "medium",
        title=f"only {overlapped_pct:.1f}% of NCCL time overlaps compute; {ms(exposed)} exposed"
              + (f" on late device {result.least_nccl_device}" if late_rank else ""),
        evidence={"overlapped_pct": overlapped_pct, "exposed_ns": exposed, "exposed_window_pct": exposed_pct},
        time_at_stake_ns=exposed // 2, device=result.least_nccl_device if late_rank else None)]


def _shared(result: Result) -> list[Finding]:
    exposed = {d.device: d.exposed_ns for d in result.devices}
    return [Finding(
        root_cause="nccl-on-compute-stream", severity="medium",
        title=f"stream {s.stream} on device {s.device} runs {s.nccl_kernels} NCCL and {s.compute_kernels} "
              "compute kernels: they can only take turns",
        evidence={"stream": s.stream if s.stream is not None else -1, "nccl_kernels": s.nccl_kernels,
                  "compute_kernels": s.compute_kernels},
        time_at_stake_ns=exposed.get(s.device, 0), device=s.device) for s in result.nccl_on_compute_stream]


def _straggler(result: Result) -> Finding | None:
    if result.spread_pct < STRAGGLER_SPREAD_PCT:
        return None
    window_pct = pct(result.spread_ns, result.scope.duration_ns)
    return Finding(
        root_cause="nccl-straggler", severity="high" if window_pct >= STRAGGLER_HIGH_PCT else "medium",
        title=f"device {result.least_nccl_device} spends {ms(result.spread_ns)} less in NCCL than the busiest "
              "rank: it arrives late and the others wait for it",
        evidence={"spread_ns": result.spread_ns, "spread_pct": result.spread_pct, "spread_window_pct": window_pct,
                  "least_nccl_device": result.least_nccl_device},
        time_at_stake_ns=result.spread_ns, device=result.least_nccl_device)


def _imbalance(result: Result) -> list[Finding]:
    if result.window_pct < NCCL_SHARE_PCT:
        return []
    return [Finding(
        root_cause="compute-communication-imbalance", severity="medium",
        title=f"NCCL takes {result.window_pct:.1f}% of the window on average per device",
        evidence={"window_pct": result.window_pct, "nccl_ns": result.nccl_ns, "exposed_ns": result.exposed_ns},
        time_at_stake_ns=result.exposed_ns // 2)]


def render(result: Result) -> str:
    if not result.has_nccl:
        return f"No NCCL kernels on device(s) {result.scope.devices}: {result.note}"
    lines = [f"NCCL: {result.nccl_count:,} kernels, {ms(result.nccl_ns)} ({result.window_pct:.1f}% of the window "
             f"per device); {result.overlapped_pct:.1f}% overlapped with compute, {ms(result.exposed_ns)} exposed"]
    lines.extend(f"  {r.collective:<14} stream {r.stream}: x{r.count:<6,} {ms(r.total_ns):>14} mean {ms(r.mean_ns)}, "
                 f"{r.window_pct:.1f}% of window, overlapped {r.overlapped_pct:.1f}%" for r in result.rows)
    if result.truncated:
        lines.append(f"  ... {result.total_rows - len(result.rows)} more rows: raise `limit` to see them")
    lines.extend(f"  device {d.device}: {ms(d.nccl_ns)} NCCL ({d.window_pct:.1f}%), exposed {ms(d.exposed_ns)}"
                 for d in result.devices)
    if result.least_nccl_device is not None:
        lines.append(f"rank balance: spread {ms(result.spread_ns)} ({result.spread_pct:.1f}% of the mean); "
                     f"least NCCL time on device {result.least_nccl_device}")
    lines.extend(f"shared stream: device {s.device} stream {s.stream} ({s.nccl_kernels} NCCL, "
                 f"{s.compute_kernels} compute)" for s in result.nccl_on_compute_stream)
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
