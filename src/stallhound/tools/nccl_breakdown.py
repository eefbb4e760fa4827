"""Where does each device's NCCL time go: hidden under compute, exposed, or waiting for a rank that arrives last?

Time: communication kernels (kernels.category = 'nccl': NCCL's, and those of the other libraries of
formats/comm_kernels.py, listed in `families`; "NCCL" below means all of them) of the devices in scope, clipped to
the window (default: GPU-active). Rows per (collective type, stream) over those devices: count, total_ns (sum of clipped
durations), mean_ns, window_pct = total_ns / (window x devices in scope). overlapped_ns = time of each
NCCL kernel during which its device also ran a non-NCCL kernel (intersection with the union of the
other kernels' intervals on that device); overlapped_pct = overlapped_ns / total_ns; exposed_ns =
total_ns - overlapped_ns (communication not hidden by compute). devices: the same per device, with
window_pct = nccl_ns / window; spread_ns = max - min of per-device NCCL time, spread_pct = spread / mean
(data only: the late rank is read from arrival, not from totals). nccl_on_compute_stream lists streams
that carry both NCCL and non-NCCL kernels, with the exposed NCCL time on them and the share of the device's
non-NCCL kernel time they carry (compute_share_pct, of clipped durations).

Arrival (needs two or more devices in scope; omit `device` to compare all):
- Matching, per collective type (nccl_collective, 'other' when unnamed): the NCCL kernels of each device
  that overlap the window, numbered in start order; the devices that ran the type are its participants
  (at least two). The device with the most instances is the reference; every other participant is
  shifted by the s in -MAX_SHIFT..MAX_SHIFT instances that minimises the median |end difference| between
  its instance k + s and the reference's instance k (smaller |s| on ties): a collective ends on every rank
  within microseconds, while the starts differ by the very skew measured here, so ends align the
  sequences even when the window or the capture cut a collective on some devices only. Instance k of the
  reference and the shifted instances form one matched collective when every participant has one and all
  of them still run when the last one starts (min end >= max start, true of any real collective); every
  other kernel is left out and counted in unmatched_kernels.
- Per matched collective: arrival = kernel start (unclipped) per device; skew_ns = last - first arrival;
  the last arriver (lowest device id on an exact tie); transfer_ns = the last arriver's kernel duration
  (the collective's own time once every rank is there). median_skew_ns, p90_skew_ns (linear
  interpolation) and median_transfer_ns over matched collectives.
- Per device: collectives it took part in, last_count and last_share_pct = last_count / collectives;
  wait_ns = its NCCL kernel time before the last arrival ([own start, min(last arrival, own end)) clipped
  to the window), summed over matched collectives; straggler_wait_ns = the same over the collectives the
  straggler arrived last to.
- Straggler: the device with the highest last_share_pct, named only when matched >= MIN_MATCHED, its
  share >= LAST_SHARE_MIN_PCT and median_skew_ns >= skew_threshold_ns = max(MIN_SKEW_NS,
  SKEW_TRANSFER_RATIO x median_transfer_ns); `verdict` says which test failed otherwise.

Findings, per device, with disjoint time at stake (each capped at the window): nccl-straggler on each
waiting device (its straggler_wait_ns). The rest of its exposed NCCL time, pool = exposed_ns -
straggler_wait_ns, goes to at most one finding, first match wins (the last two never claim time measured as
waiting for other ranks, wait_ns: tuning a collective cannot recover it):
1. nccl-on-compute-stream: shared streams that carry >= COMPUTE_STREAM_MIN_PCT of the device's non-NCCL kernel
   time (compute streams) hold >= SHARED_MIN_PCT of its exposed NCCL time; stake = that time within the pool. First
   because a shared stream forbids overlap whatever else is tuned. Not for SERIAL_BY_DESIGN variants (tensor-parallel
   all-reduce, whose result the next kernel needs).
2. compute-communication-imbalance: no straggler, NCCL >= NCCL_SHARE_PCT of the window on the device and a
   median skew at or above the threshold; stake = wait_ns within the pool (waiting for varying late ranks).
3. nccl-serialization: overlapped_pct < OVERLAP_MIN_PCT and pool - wait_ns >= EXPOSED_MIN_PCT of the window;
   stake = pool - wait_ns. With one device in scope the wait cannot be measured: the title says so.
Each finding's tags name its variant (analysis/comm_context.py: the collective pattern and the parallel framework
seen, in `context`), which picks the book's fix. Message sizes and algorithm bandwidth, where the profile records
them: see analysis.nccl_sizes. Times in ns.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import comm_context, nccl_arrival, nccl_sizes, rules, shares
from stallhound.analysis.common import (
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
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.intervals import covered, overlaps
from stallhound.formats.remedy import remedy

TRIAGE = TriageRole("window", order=5)
OVERLAP_MIN_PCT = 50.0  # book nccl-serialization: overlapped_pct well below 50% means collectives take turns
EXPOSED_MIN_PCT = 10.0  # ... and only when the exposed time is a sizeable share of the window
NCCL_SHARE_PCT = 20.0  # book compute-communication-imbalance: NCCL above 20% of the window is a red flag
SHARED_MIN_PCT = 50.0  # shared streams holding most of a device's exposed NCCL time: the stream layout decides
# A stream carrying this share of the device's compute is a compute stream; a communication library's own stream
# that runs a few helper kernels (DeepEP's layout and casts) is not one.
COMPUTE_STREAM_MIN_PCT = 25.0
# Variants whose collective the next kernel on the stream needs at once: tensor-parallel all-reduce of a layer's
# output. Another stream gains nothing without independent work to run beside it, so sharing is no finding.
SERIAL_BY_DESIGN = frozenset({"tp-allreduce"})
BUCKET_NS = 1_000_000  # overlap join buckets: NCCL kernels span a few, most compute kernels fit in one


ALONE = " (one device in scope: this includes any wait for other ranks; compare every rank to separate it)"
NO_NCCL = ("no NCCL kernels in this window (a single-GPU run, or communication not captured: trace every rank "
           "with {capture})")


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
    overlapped_pct: float
    exposed_ns: int
    collectives: list[str] = Field(description="collective types it ran")


class SharedStream(BaseModel):
    device: int
    stream: int | None
    nccl_kernels: int
    compute_kernels: int = Field(description="non-NCCL kernels on the same stream")
    compute_share_pct: float = Field(description="their time / the device's non-NCCL kernel time (clipped)")
    exposed_ns: int = Field(description="exposed NCCL time on this stream")


class Result(Output):
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
    nccl_on_compute_stream: list[SharedStream]
    arrival: nccl_arrival.Arrival | None = Field(description="per-collective arrival across devices; null without NCCL")
    message_sizes: nccl_sizes.Sizes | None = Field(None, description="message sizes and algorithm bandwidth per "
                                                   "(collective, size, group), where recorded; null without NCCL")
    families: list[shares.FamilyTime] = Field(default_factory=list, description=(
        "libraries of the communication kernels counted here (NCCL, expert-parallel, custom all-reduce, ...)"))
    context: comm_context.Context | None = Field(None, description=(
        "per device the collective pattern with the most time and the c10d ops behind it, and the parallel "
        "frameworks seen: what picks each finding's fix; null without NCCL"))
    findings: list[Finding] = []


# Per NCCL kernel: the pieces of other kernels of its device that overlap it (bucketed hash join, see
# intervals.overlaps), then their union length (intervals.covered). Grouping bits: 1 = per (collective,
# stream), 6 = per device, 4 = per (device, stream).
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
SELECT grouping(coll, stream_id, device_id), coll, stream_id, device_id, count(DISTINCT device_id), count(*),
       sum(dur), avg(dur), sum(covered), list(DISTINCT coll ORDER BY coll)
FROM n GROUP BY GROUPING SETS ((coll, stream_id), (device_id), (device_id, stream_id)) ORDER BY 1, 4, 7 DESC, 2, 3
"""

SHARED_SQL = """
WITH s AS (
  SELECT device_id, stream_id, count(*) FILTER (WHERE category = 'nccl') AS nccl,
         count(*) FILTER (WHERE category <> 'nccl') AS compute,
         coalesce(sum(least(end_ns, $end) - greatest(start_ns, $start)) FILTER (WHERE category <> 'nccl'), 0) AS ns
  FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end
  GROUP BY device_id, stream_id)
SELECT device_id, stream_id, nccl, compute, ns / nullif(sum(ns) OVER (PARTITION BY device_id), 0)
FROM s QUALIFY nccl > 0 AND compute > 0 ORDER BY device_id, stream_id
"""

def _spread(devices: list[DeviceNccl], scope: Scope) -> tuple[int, float]:
    if len(scope.devices) < 2 or not devices:
        return 0, 0.0
    totals = {d: 0 for d in scope.devices} | {d.device: d.nccl_ns for d in devices}
    spread = max(totals.values()) - min(totals.values())
    return spread, pct(spread, sum(totals.values()) / len(totals))



def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params, default="gpu_active")
    args = scope_args(scope)
    capacity = scope.duration_ns * max(len(scope.devices), 1)
    groups = con.execute(SQL, {**args, "bucket_ns": BUCKET_NS}).fetchall()
    rows = [CollectiveRow(collective=r[1], stream=r[2], devices=r[4], count=r[5], total_ns=int(r[6]),
                          mean_ns=round(r[7], 1), window_pct=pct(r[6], capacity), overlapped_ns=int(r[8]),
                          overlapped_pct=pct(r[8], r[6]), exposed_ns=int(r[6] - r[8])) for r in groups if r[0] == 1]
    devices = [DeviceNccl(device=r[3], count=r[5], nccl_ns=int(r[6]), mean_ns=round(r[7], 1),
                          window_pct=pct(r[6], scope.duration_ns), overlapped_ns=int(r[8]),
                          overlapped_pct=pct(r[8], r[6]), exposed_ns=int(r[6] - r[8]), collectives=r[9])
               for r in groups if r[0] == 6]
    stream_exposed = {(r[3], r[2]): int(r[6] - r[8]) for r in groups if r[0] == 4}
    total, covered = sum(d.nccl_ns for d in devices), sum(d.overlapped_ns for d in devices)
    spread, spread_pct = _spread(devices, scope)
    return Result(
        scope=scope, has_nccl=bool(devices),
        note=None if devices else NO_NCCL.format(capture=remedy(con, ("kernels", "nvtx"))),
        nccl_count=sum(d.count for d in devices), nccl_ns=total, window_pct=pct(total, capacity),
        overlapped_ns=covered, overlapped_pct=pct(covered, total), exposed_ns=total - covered,
        rows=rows[:params.limit], truncated=len(rows) > params.limit, total_rows=len(rows), devices=devices,
        spread_ns=spread, spread_pct=spread_pct,
        nccl_on_compute_stream=[SharedStream(device=r[0], stream=r[1], nccl_kernels=r[2], compute_kernels=r[3],
                                             compute_share_pct=round(100 * (r[4] or 0), 2),
                                             exposed_ns=stream_exposed.get((r[0], r[1]), 0))
                                for r in con.execute(SHARED_SQL, args).fetchall()],
        arrival=nccl_arrival.measure(con, args, scope, params.limit) if devices else None,
        message_sizes=nccl_sizes.run(con, args, params.limit) if devices else None,
        families=shares.families(con, args) if devices else [],
        context=comm_context.measure(con, args) if devices else None)


def findings(result: Result) -> list[Finding]:
    """nccl-straggler per waiting device, then at most one other finding per device on what is left."""
    if not result.has_nccl or result.arrival is None:
        return []
    arrival = result.arrival
    waits = {a.device: a for a in arrival.devices}
    found = _straggler(result, arrival)
    for d in result.devices:
        wait = waits.get(d.device)
        # concurrent NCCL kernels of one device can sum past the window: never claim more than it
        pool = min(max(0, d.exposed_ns - (wait.straggler_wait_ns if wait else 0)), result.scope.duration_ns)
        other_wait = wait.wait_ns - wait.straggler_wait_ns if wait else 0
        chosen = (_shared(result, d, pool) or _imbalance(result, arrival, d, wait, pool)
                  or _serialization(result, d, max(0, pool - other_wait)))
        if chosen:
            found.append(chosen)
    return found


def _tags(result: Result, d: DeviceNccl) -> list[str]:
    return comm_context.tags(result.context, d.device) if result.context else []


def label(result: Result) -> str:
    """What the figures count: 'NCCL', or 'communication' when other libraries' kernels are among them."""
    return "NCCL" if {f.family for f in result.families} <= {"NCCL"} else "communication"


def _straggler(result: Result, arrival: nccl_arrival.Arrival) -> list[Finding]:
    late = next((a for a in arrival.devices if a.device == arrival.straggler_device), None)
    if late is None:
        return []
    tags = {d.device: _tags(result, d) for d in result.devices}
    return [Finding(
        root_cause="nccl-straggler",
        severity=rules.severity(a.straggler_wait_ns, result.scope.duration_ns),
        title=f"device {a.device} waits {ms(a.straggler_wait_ns)} inside NCCL kernels for device {late.device}, "
              f"which arrives last to {late.last_count} of {late.collectives} collectives",
        evidence={"late_device": late.device, "late_last_share_pct": late.last_share_pct,
                  "late_last_count": late.last_count, "median_skew_ns": arrival.median_skew_ns,
                  "wait_ns": a.straggler_wait_ns,
                  "wait_window_pct": pct(a.straggler_wait_ns, result.scope.duration_ns)},
        time_at_stake_ns=min(a.straggler_wait_ns, result.scope.duration_ns), device=a.device,
        tags=tags.get(a.device, []))
        for a in arrival.devices if a.device != late.device and a.straggler_wait_ns > 0]


def _shared(result: Result, d: DeviceNccl, pool: int) -> Finding | None:
    shared = [s for s in result.nccl_on_compute_stream
              if s.device == d.device and s.compute_share_pct >= COMPUTE_STREAM_MIN_PCT]
    exposed = sum(s.exposed_ns for s in shared)
    stake = min(pool, exposed)
    if not shared or pct(exposed, d.exposed_ns) < SHARED_MIN_PCT or stake <= 0 or SERIAL_BY_DESIGN & set(
            _tags(result, d)):
        return None
    streams = ", ".join(str(s.stream) for s in shared)
    return Finding(
        root_cause="nccl-on-compute-stream", severity="medium",
        title=f"device {d.device}: {label(result)} shares stream {streams} with "
              f"{sum(s.compute_kernels for s in shared):,} compute kernels, so they can only take turns; "
              f"{ms(stake)} exposed",
        evidence={"streams": streams, "nccl_kernels": sum(s.nccl_kernels for s in shared),
                  "compute_kernels": sum(s.compute_kernels for s in shared), "exposed_ns": stake},
        time_at_stake_ns=stake, device=d.device, tags=_tags(result, d))


def _imbalance(result: Result, arrival: nccl_arrival.Arrival, d: DeviceNccl, wait: nccl_arrival.DeviceArrival | None,
               pool: int) -> Finding | None:
    if wait is None:
        return None
    stake = min(pool, wait.wait_ns)
    if (arrival.straggler_device is not None or arrival.matched < nccl_arrival.MIN_MATCHED
            or d.window_pct < NCCL_SHARE_PCT or arrival.median_skew_ns < arrival.skew_threshold_ns or stake <= 0):
        return None
    return Finding(
        root_cause="compute-communication-imbalance", severity="medium",
        title=f"device {d.device}: {label(result)} takes {d.window_pct:.1f}% of the window and ranks arrive "
              f"{ms(arrival.median_skew_ns)} apart (median) with no fixed late rank; {ms(stake)} waiting",
        evidence={"window_pct": d.window_pct, "nccl_ns": d.nccl_ns, "wait_ns": wait.wait_ns,
                  "median_skew_ns": arrival.median_skew_ns, "last_share_pct": wait.last_share_pct},
        time_at_stake_ns=stake, device=d.device, tags=_tags(result, d))


def _serialization(result: Result, d: DeviceNccl, pool: int) -> Finding | None:
    exposed_pct = pct(pool, result.scope.duration_ns)
    if d.overlapped_pct >= OVERLAP_MIN_PCT or exposed_pct < EXPOSED_MIN_PCT:
        return None
    alone = len(result.scope.devices) < 2
    return Finding(
        root_cause="nccl-serialization", severity="high" if exposed_pct >= NCCL_SHARE_PCT else "medium",
        title=f"device {d.device}: only {d.overlapped_pct:.1f}% of {label(result)} time overlaps compute; {ms(pool)} "
              f"exposed{ALONE if alone else ''}",
        evidence={"overlapped_pct": d.overlapped_pct, "exposed_ns": pool, "exposed_window_pct": exposed_pct,
                  "wait_measured": not alone},
        time_at_stake_ns=pool, device=d.device, tags=_tags(result, d))


def render(result: Result) -> str:
    if not result.has_nccl:
        return f"No NCCL kernels on device(s) {result.scope.devices}: {result.note}"
    families = f" ({', '.join(f.family for f in result.families)})" if label(result) != "NCCL" else ""
    lines = [f"{label(result)}{families}: {result.nccl_count:,} kernels, {ms(result.nccl_ns)} "
             f"({result.window_pct:.1f}% of the window "
             f"per device); {result.overlapped_pct:.1f}% overlapped with compute, {ms(result.exposed_ns)} exposed"]
    lines.extend(f"  {r.collective:<14} stream {r.stream}: x{r.count:<6,} {ms(r.total_ns):>14} mean {ms(r.mean_ns)}, "
                 f"{r.window_pct:.1f}% of window, overlapped {r.overlapped_pct:.1f}%" for r in result.rows)
    if result.truncated:
        lines.extend(f"  {line}" for line in more_rows(result, result.total_rows - len(result.rows), "rows"))
    lines.extend(f"  device {d.device}: {ms(d.nccl_ns)} {label(result)} ({d.window_pct:.1f}%), exposed "
                 f"{ms(d.exposed_ns)}" for d in result.devices)
    a, sizes = result.arrival, result.message_sizes
    assert a is not None and sizes is not None  # both are measured whenever there is NCCL
    lines.extend(nccl_sizes.render(sizes))
    lines.extend(f"shared stream: device {s.device} stream {s.stream} ({s.nccl_kernels} {label(result)}, "
                 f"{s.compute_kernels} compute with {s.compute_share_pct:.1f}% of the device's compute time, "
                 f"{ms(s.exposed_ns)} exposed)" for s in result.nccl_on_compute_stream)
    lines.append(f"arrival: {a.matched:,} collectives matched ({a.unmatched_kernels:,} kernels unmatched); skew median "
                 f"{ms(a.median_skew_ns)}, p90 {ms(a.p90_skew_ns)}; transfer median {ms(a.median_transfer_ns)}")
    lines.extend(f"  device {d.device}: last to {d.last_count} of {d.collectives} ({d.last_share_pct:.1f}%), "
                 f"waits {ms(d.wait_ns)}" for d in a.devices)
    lines.extend(f"  skewed {w.collective} at {w.first_arrival_ns}: {ms(w.skew_ns)}, device {w.last_device} last"
                 for w in a.worst)
    lines.append(f"  {a.verdict}")
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
