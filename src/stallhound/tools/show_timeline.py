"""What does each GPU's timeline look like: its lanes of work, its idle gaps and the steps above them?

Over the window (default: GPU-active), per device, one lane per kind of work that occurs: compute (kernels other
than NCCL, and whole CUDA graph executions), nccl (communication kernels: NCCL's and the other families of
formats/comm_kernels.py), h2d and d2h copies, other_copy (device to
device, peer, host to host, unified memory) and memset. The window is cut into `buckets` equal columns (as
gpu_utilization's slices); a lane's `levels` holds one digit per column: 0 when nothing of the lane runs in
it, else ceil(9 x busy share), busy being the union of the lane's intervals (overlap counts once), so a
single short kernel still shows as 1. Exact, however long the profile: `limit` kernels and `limit` idle gaps
(>= 1 ms, each with its cause and blocking call from analysis/attribution.py, as gpu_idle_gaps decides them), each
device's longest in turn (every device's longest, then every device's second, ...), so one device's long
collectives cannot hide another's. steps: the iterations of the capture (tools/iterations.py, at most 500;
`range_name` picks the step range as it takes it) that overlap the window. Lanes (in device order), kernels and
gaps (longest first) are flat lists, a `device` on each.
Clients that show MCP Apps draw it as a zoomable picture (ui://stallhound/timeline.html); `stallhound report`
writes the same picture into an HTML file. No findings: gpu_idle_gaps and triage judge what it shows. Times in ns.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import attribution
from stallhound.analysis.common import (
    MAX_LIMIT,
    Output,
    Scope,
    ScopedParams,
    more_rows,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.intervals import pieces
from stallhound.analysis.step_boundaries import boundaries
from stallhound.tools import iterations

LEVELS = 9  # digits 1-9 for busy columns: enough shades for a pixel column, one character each
# Columns: five screen widths, room for a report to zoom in; and a lane of this many digits still fits the default
# result budget whole, so the budget leaves out lanes, never part of one.
MAX_BUCKETS = 10_000
SPANS_SHOWN = 10  # longest kernels and gaps by default: the ones an eye looks for first
CUT_HINT = "lower `buckets` (one character per column and lane)"  # read by the budget
LANES = ("compute", "nccl", "h2d", "d2h", "other_copy", "memset")

Lane = Literal["compute", "nccl", "h2d", "d2h", "other_copy", "memset"]


class Params(ScopedParams):
    buckets: Annotated[int, Field(description=f"Columns the window is cut into, one digit each per lane "
                                              f"(10-{MAX_BUCKETS:,}); a picture wants about one per pixel",
                                  ge=10, le=MAX_BUCKETS)] = 100
    limit: Annotated[int, Field(description=f"Longest kernels and longest idle gaps kept exactly, each, taking "
                                            f"the devices' longest in turn (1-{MAX_LIMIT})",
                                ge=1, le=MAX_LIMIT)] = SPANS_SHOWN
    range_name: Annotated[str | None, Field(
        description=iterations.Params.model_fields["range_name"].description)] = None


class LaneRow(BaseModel):
    device: int
    lane: Lane
    busy_ns: int = Field(description="union of the lane's intervals in the window")
    busy_pct: float
    levels: str = Field(description="one digit per column: 0 idle, k = busy more than (k-1)/9 and at most k/9 of it")


class KernelSpan(BaseModel):
    device: int
    lane: Lane
    name: str = Field(description="short kernel name")
    start_ns: int
    end_ns: int
    duration_ns: int


class GapSpan(BaseModel):
    device: int
    start_ns: int
    end_ns: int
    duration_ns: int
    cause: str = Field(description="as gpu_idle_gaps: queued, sync, readback, pageable_copy, ..., host_untraced")
    blocked_in: str | None = Field(description="blocking API the host was inside when the device ran dry (or, for a "
                                                           "short gap, had returned from before its next launch)")


class DeviceSummary(BaseModel):
    device: int
    busy_pct: float = Field(description="share of the window with any work on the device")
    idle_ns: int
    gap_count: int = Field(description="idle gaps of at least 1 ms")
    kernel_count: int = Field(description="kernels in the window")


class StepSpan(BaseModel):
    index: int
    start_ns: int
    end_ns: int


class Result(Output):
    scope: Scope
    buckets: int
    bucket_ns: int = Field(description="nominal column length (columns differ by at most 1 ns)")
    devices: list[DeviceSummary]
    lanes: list[LaneRow] = Field(description="per device in order, only the lanes with work, in the order compute, "
                                             "nccl, h2d, d2h, other_copy, memset")
    kernels: list[KernelSpan] = Field(description="at most `limit`, each device's longest in turn, then longest first")
    gaps: list[GapSpan] = Field(description="at most `limit`, each device's longest in turn, then longest first")
    steps: list[StepSpan] = Field(description=f"iterations overlapping the window (of the first {MAX_LIMIT})")
    step_method: str | None = Field(description="how iterations found the steps; null when it found none")
    truncated: bool = Field(description="true when there are more kernels or gaps than `limit`")


LANE_CODE = {lane: code for code, lane in enumerate(LANES)}  # lanes travel as small integers: cheaper to sort on
LANE_WORK = f"""lane_work AS (
  SELECT device_id, lane, greatest(start_ns, $start) AS start_ns, least(end_ns, $end) AS end_ns
  FROM (SELECT device_id, CASE WHEN category = 'nccl' THEN {LANE_CODE['nccl']} ELSE {LANE_CODE['compute']} END
               AS lane, start_ns, end_ns FROM kernels
        UNION ALL SELECT device_id, {LANE_CODE['compute']}, start_ns, end_ns FROM graph_exec
        UNION ALL SELECT device_id, CASE direction WHEN 'H2D' THEN {LANE_CODE['h2d']} WHEN 'D2H' THEN {LANE_CODE['d2h']}
                         ELSE {LANE_CODE['other_copy']} END, start_ns, end_ns FROM memcpy
        UNION ALL SELECT device_id, {LANE_CODE['memset']}, start_ns, end_ns FROM memset)
  WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end AND end_ns > start_ns)"""

# Column b covers [edge(b), edge(b + 1)) with edge(b) = $start + ceil(b * $width / $buckets), as gpu_utilization's
# slices. Each disjoint busy piece counts whole in its column when it fits in one (nearly all do), else it is split
# over the columns it touches.
EDGE = "($start + ((%s) * $width + $buckets - 1) // $buckets)"
LANES_SQL = "WITH " + LANE_WORK + ",\n" + pieces("lane_busy", "lane_work", "device_id, lane") + """,
spans AS MATERIALIZED (
  SELECT *, ((start_ns - $start) * $buckets) // $width AS b0, ((end_ns - 1 - $start) * $buckets) // $width AS b1
  FROM lane_busy),
columns_of AS (
  SELECT device_id, lane, b0 AS b, end_ns - start_ns AS ns FROM spans WHERE b0 = b1
  UNION ALL
  SELECT device_id, lane, b, least(end_ns, """ + EDGE % "b + 1" + ") - greatest(start_ns, " + EDGE % "b" + """)
  FROM (SELECT *, unnest(range(b0, b1 + 1)) AS b FROM spans WHERE b0 < b1)),
columns AS (
  SELECT device_id, lane, b, sum(ns) AS ns,
         ceil($levels * sum(ns) / (""" + EDGE % "b + 1" + " - " + EDGE % "b" + """))::INTEGER AS level
  FROM columns_of GROUP BY device_id, lane, b)
SELECT device_id, lane, sum(ns)::BIGINT, list([b, level]) FROM columns GROUP BY ALL
"""

# Each device's `limit` longest (max_by keeps them without sorting the device's kernels), then in turns.
KERNELS_SQL = """
SELECT device_id, lane, short_name, start_ns, end_ns FROM (
  SELECT unnest(max_by({device_id: device_id, lane: CASE WHEN category = 'nccl' THEN 'nccl' ELSE 'compute' END,
                        short_name: short_name, start_ns: start_ns, end_ns: end_ns},
                       (end_ns - start_ns, -start_ns), $limit), recursive := true)
  FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end
  GROUP BY device_id)
ORDER BY row_number() OVER (PARTITION BY device_id ORDER BY end_ns - start_ns DESC, start_ns),
         end_ns - start_ns DESC, device_id, start_ns
LIMIT $limit
"""
KERNEL_COUNTS_SQL = """
SELECT device_id, count(*) FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start
  AND start_ns < $end GROUP BY ALL
"""


def _levels(columns: list[list[int]], buckets: int) -> str:
    digits = bytearray(b"0" * buckets)
    for b, level in columns:
        digits[b] = ord("0") + min(LEVELS, max(1, level))
    return digits.decode()


def _lanes(con: duckdb.DuckDBPyConnection, scope: Scope, buckets: int) -> list[LaneRow]:
    args = {**scope_args(scope), "buckets": buckets, "width": scope.duration_ns, "levels": LEVELS}
    found = [LaneRow(device=device, lane=LANES[lane], busy_ns=busy, busy_pct=pct(busy, scope.duration_ns),
                     levels=_levels(columns, buckets))
             for device, lane, busy, columns in con.execute(LANES_SQL, args).fetchall()]
    return sorted(found, key=lambda row: (row.device, LANE_CODE[row.lane]))


def _kernels(con: duckdb.DuckDBPyConnection, scope: Scope, limit: int) -> tuple[list[KernelSpan], dict[int, int]]:
    args = scope_args(scope)
    spans = [KernelSpan(device=device, lane=lane, name=name, start_ns=start, end_ns=end, duration_ns=end - start)
             for device, lane, name, start, end in con.execute(KERNELS_SQL, {**args, "limit": limit}).fetchall()]
    return spans, dict(con.execute(KERNEL_COUNTS_SQL, args).fetchall())


def _steps(con: duckdb.DuckDBPyConnection, params: Params, scope: Scope) -> tuple[list[StepSpan], str | None]:
    """The iterations of the whole capture (as tools/iterations.py finds them, its first MAX_LIMIT) that overlap
    the window: a step the window cuts still shows. Only their bounds: not the per-step GPU busy iterations
    measures, which costs more than the search."""
    capture = resolve_scope(con, ScopedParams(profile=params.profile, device=params.device))
    method, _, _, spans = boundaries(con, capture, params.range_name, "auto")
    return [StepSpan(index=i, start_ns=s, end_ns=e) for i, (s, e) in enumerate(spans[:MAX_LIMIT])
            if e > scope.start_ns and s < scope.end_ns], method


def _gaps(attr: attribution.Attribution, limit: int) -> list[GapSpan]:
    """`limit` gaps of at least 1 ms as the attribution judged them, each device's longest in turn."""
    longest = sorted(attr.long_gaps, key=lambda g: (g.start_ns - g.end_ns, g.device, g.start_ns))
    rank: Counter[int] = Counter()
    turns = []
    for g in longest:
        turns.append((rank[g.device], g))
        rank[g.device] += 1
    found = [g for _, g in sorted(turns, key=lambda t: t[0])]  # stable: longest first within a turn
    return [GapSpan(device=g.device, start_ns=g.start_ns, end_ns=g.end_ns, duration_ns=g.end_ns - g.start_ns,
                    cause=g.cause, blocked_in=g.blocked_in) for g in found[:limit]]


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params, default="gpu_active")
    attr = attribution.attribute(con, scope)
    kernels, kernel_counts = _kernels(con, scope, params.limit)
    gap_counts = Counter(g.device for g in attr.long_gaps)
    devices = [DeviceSummary(device=d, busy_pct=attr.devices[d].busy_pct, idle_ns=attr.devices[d].idle_ns,
                             gap_count=gap_counts[d], kernel_count=kernel_counts.get(d, 0)) for d in scope.devices]
    steps, method = _steps(con, params, scope)
    truncated = len(kernels) < sum(kernel_counts.values()) or len(attr.long_gaps) > params.limit
    return Result(scope=scope, buckets=params.buckets, bucket_ns=scope.duration_ns // params.buckets,
                  devices=devices, lanes=_lanes(con, scope, params.buckets), kernels=kernels,
                  gaps=_gaps(attr, params.limit), steps=steps, step_method=method, truncated=truncated)


def render(result: Result) -> str:
    s = result.scope
    lines = [f"timeline of {ms(s.duration_ns)} ({s.window_basis} window) in {result.buckets} columns of "
             f"{ms(result.bucket_ns)}; a digit per column: 0 idle, 1-9 busy share in ninths"]
    for d in result.devices:
        lines.append(f"device {d.device}: busy {d.busy_pct:.1f}%, idle {ms(d.idle_ns)}, {d.gap_count} gaps >= 1 ms, "
                     f"{d.kernel_count:,} kernels")
        lines.extend(f"  {lane.lane:>10} {lane.busy_pct:5.1f}% {lane.levels}" for lane in result.lanes
                     if lane.device == d.device)
    lines.extend(f"gap {ms(g.duration_ns)} dev {g.device} at {g.start_ns}: {g.cause}"
                 + (f" in {g.blocked_in}" if g.blocked_in else "") for g in result.gaps)
    lines.extend(more_rows(result, sum(d.gap_count for d in result.devices) - len(result.gaps), "gaps"))
    lines.extend(f"kernel {ms(k.duration_ns)} dev {k.device} at {k.start_ns}: {k.name}"[:160] for k in result.kernels)
    lines.extend(more_rows(result, sum(d.kernel_count for d in result.devices) - len(result.kernels), "kernels"))
    if result.steps:
        lines.append(f"{len(result.steps)} steps by {result.step_method}: " + ", ".join(
            f"{st.index}@{st.start_ns}" for st in result.steps[:10]) + (" ..." if len(result.steps) > 10 else ""))
    return "\n".join(lines)
