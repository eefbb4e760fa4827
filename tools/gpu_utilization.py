"""How busy is each GPU, on which streams, and is its idle time concentrated or spread out?

Over the window (default: GPU-active, first to last GPU operation of any device), per device: busy_ns =
length of the union of its kernel, memcpy, memset and whole CUDA graph execution intervals clipped to the
window (overlapping work counts once); busy_pct = busy_ns / window; idle_ns = window - busy_ns;
kernel_busy_ns/_pct = the same union over kernels and graph executions only; overlap_ns/_pct = time with 2+
kernels running at once on the device. streams: per-stream union of its work / window. timeline: the window
cut into `buckets` equal slices, busy_pct of each; idle_concentration_pct = share of the device's idle
time that falls in its worst 20% of slices (about 20 when idle is spread evenly, near 100 when it sits in
one stretch). No findings: why the devices are idle is gpu_idle_gaps' question. Times in ns.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.tools.common import (
    DEFAULT_LIMIT,
    LimitParam,
    Output,
    Scope,
    ScopedParams,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from nsightful.tools.intervals import GPU_WORK

NO_GPU_NOTE = ("the profile has no GPU activity (no kernel, memcpy or memset), so there is no utilization to "
               "measure; re-capture with `nsys profile --trace=cuda`")
WORST_SHARE = 0.2  # fraction of slices whose idle time idle_concentration_pct measures
CONCENTRATED_PCT = 50.0  # half the idle time in the worst fifth of slices: a few long stalls, not jitter
MIN_BUCKETS_FOR_PATTERN = 5  # with fewer slices "worst 20%" is a single slice and says nothing


class Params(ScopedParams):
    buckets: Annotated[int, Field(description="Number of equal time slices in the timeline (1-200)",
                                  ge=1, le=200)] = 20
    limit: LimitParam = DEFAULT_LIMIT


class StreamBusy(BaseModel):
    stream: int | None
    busy_ns: int
    busy_pct: float


class DeviceUtilization(BaseModel):
    device: int
    busy_ns: int
    busy_pct: float
    idle_ns: int
    kernel_busy_ns: int
    kernel_busy_pct: float
    overlap_ns: int = Field(description="time with 2+ kernels running at once")
    overlap_pct: float
    stream_count: int
    streams: list[StreamBusy] = Field(description="busiest streams first, at most `limit`")
    timeline_busy_pct: list[float] = Field(description="busy_pct of each slice, in time order")
    idle_concentration_pct: float = Field(description="share of idle time in the worst 20% of slices")
    idle_pattern: Literal["concentrated", "spread", "no_idle", "unknown"] = Field(
        description="unknown when there are fewer than 5 slices")


class Result(Output):
    scope: Scope
    busy_pct: float = Field(description="busy time summed over devices / (window x devices)")
    idle_pct: float = Field(description="100 - busy_pct")
    bucket_count: int
    bucket_ns: int = Field(description="nominal slice length (slices differ by at most 1 ns)")
    devices: list[DeviceUtilization]
    truncated: bool = Field(description="true when some device had more streams than `limit`")
    note: str | None = Field(default=None, description="set when there is nothing to measure")


# Union length in one sorted pass (cheaper than numbering islands): in start order, the part [ps, e) of
# each interval past the running maximum of the ends before it is new busy time, and these pieces are
# disjoint. A piece counts in the slice of its start; the few that cross a slice edge come back as a list
# to split. The part of a kernel before the running maximum of earlier kernels' ends is time when 2+
# kernels run; the union of those parts is taken the same way. A stream none of whose operations starts
# before the end of an earlier one on its device runs them one after another: its busy time is their sum
# (mixed = false), and only the other streams need STREAMS_SQL's own sorted pass.
DEVICE_SQL = "WITH " + GPU_WORK + """,
o AS MATERIALIZED (
  SELECT device_id, stream_id, k, s, e, greatest(s, max(e) OVER w) AS ps,
         max(e) FILTER (WHERE k) OVER w AS prev_kernel_end
  FROM (SELECT device_id, stream_id, kind IN ('kernel', 'graph') AS k, start_ns AS s, end_ns AS e FROM gpu_work)
  WINDOW w AS (PARTITION BY device_id ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)),
slices AS (
  SELECT device_id, bucket, sum(e - ps) FILTER (WHERE e > ps) AS busy,
         list([ps, e]) FILTER (WHERE e > ps AND ((e - 1 - $start) * $buckets) // $width > bucket) AS spanning,
         sum(e - greatest(s, prev_kernel_end)) FILTER (WHERE k AND (e > prev_kernel_end OR prev_kernel_end IS NULL))
           AS kernel_busy
  FROM (SELECT *, ((ps - $start) * $buckets) // $width AS bucket FROM o) GROUP BY ALL),
ov AS (SELECT device_id, s, least(e, prev_kernel_end) AS e FROM o WHERE k AND prev_kernel_end > s),
ov_new AS (
  SELECT device_id, e - greatest(s, max(e) OVER (PARTITION BY device_id ORDER BY s
         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS len FROM ov)
SELECT device_id, 'slice' AS part, bucket, busy, spanning, kernel_busy AS n, NULL AS stream_id, NULL AS mixed
FROM slices
UNION ALL SELECT device_id, 'overlap', NULL, NULL, NULL, sum(len) FILTER (WHERE len > 0), NULL, NULL
FROM ov_new GROUP BY ALL
UNION ALL SELECT device_id, 'stream', NULL, NULL, NULL, sum(e - s), stream_id, bool_or(ps > s) FROM o GROUP BY ALL
"""

STREAMS_SQL = "WITH " + GPU_WORK + """,
o AS (
  SELECT device_id, stream_id, start_ns AS s, end_ns AS e, max(end_ns) OVER (PARTITION BY device_id, stream_id
         ORDER BY start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM gpu_work SEMI JOIN (SELECT unnest($mixed_devices) AS device_id, unnest($mixed_streams) AS stream_id) m
    ON m.device_id = gpu_work.device_id AND m.stream_id IS NOT DISTINCT FROM gpu_work.stream_id)
SELECT device_id, stream_id, sum(e - greatest(s, prev_end)) FILTER (WHERE e > prev_end OR prev_end IS NULL) AS busy
FROM o GROUP BY ALL
"""


def _bounds(scope: Scope, buckets: int) -> list[int]:
    """Slice edges: slice i is [bounds[i], bounds[i+1]); time t falls in slice (t - start) * buckets // width."""
    width = scope.duration_ns
    return [scope.start_ns + (i * width + buckets - 1) // buckets for i in range(buckets + 1)]


def _idle_concentration(idle: list[int]) -> tuple[float, str]:
    total = sum(idle)
    if total == 0:
        return 0.0, "no_idle"
    worst = sum(sorted(idle, reverse=True)[:max(1, math.ceil(WORST_SHARE * len(idle)))])
    share = pct(worst, total)
    if len(idle) < MIN_BUCKETS_FOR_PATTERN:
        return share, "unknown"
    return share, "concentrated" if share >= CONCENTRATED_PCT else "spread"


def _busy_by_slice(rows: list[tuple], bounds: list[int]) -> list[int]:
    """Busy ns per slice from (slice, busy, spanning pieces) rows: pieces crossing an edge are split."""
    busy = [0] * (len(bounds) - 1)
    for bucket, total, spanning in rows:
        busy[bucket] += int(total or 0)
        for ps, pe in spanning or []:
            last = ((pe - 1 - bounds[0]) * len(busy)) // (bounds[-1] - bounds[0])
            busy[bucket] -= pe - ps
            for i in range(bucket, last + 1):
                busy[i] += min(pe, bounds[i + 1]) - max(ps, bounds[i])
    return busy


def _device(device: int, busy_by_slice: list[int], kernel_busy: int, overlap: int, streams: list[tuple],
            scope: Scope, bounds: list[int], limit: int) -> DeviceUtilization:
    width = scope.duration_ns
    lengths = [hi - lo for lo, hi in zip(bounds, bounds[1:], strict=False)]
    busy = sum(busy_by_slice)
    share, pattern = _idle_concentration([n - b for n, b in zip(lengths, busy_by_slice, strict=True)])
    return DeviceUtilization(
        device=device, busy_ns=busy, busy_pct=pct(busy, width), idle_ns=width - busy,
        kernel_busy_ns=kernel_busy, kernel_busy_pct=pct(kernel_busy, width), overlap_ns=overlap,
        overlap_pct=pct(overlap, width), stream_count=len(streams),
        streams=[StreamBusy(stream=s, busy_ns=b, busy_pct=pct(b, width)) for s, b in streams[:limit]],
        timeline_busy_pct=[pct(b, n) for n, b in zip(lengths, busy_by_slice, strict=True)],
        idle_concentration_pct=share, idle_pattern=pattern)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params, default="gpu_active")
    args = {**scope_args(scope), "buckets": params.buckets, "width": scope.duration_ns}
    slices: dict[int, list[tuple]] = {d: [] for d in scope.devices}
    kernel_busy: dict[int, int] = {}
    overlap: dict[int, int] = {}
    streams: dict[int, list[tuple]] = {}
    mixed: list[tuple] = []
    for dev, part, bucket, busy, spanning, n, stream, is_mixed in con.execute(DEVICE_SQL, args).fetchall():
        if part == "slice":
            if busy is not None:
                slices[dev].append((bucket, busy, spanning))
            kernel_busy[dev] = kernel_busy.get(dev, 0) + int(n or 0)
        elif part == "overlap":
            overlap[dev] = int(n or 0)
        elif is_mixed:
            mixed.append((dev, stream))
        else:
            streams.setdefault(dev, []).append((stream, int(n)))
    if mixed:
        found = con.execute(STREAMS_SQL, {**scope_args(scope), "mixed_devices": [d for d, _ in mixed],
                                          "mixed_streams": [s for _, s in mixed]}).fetchall()
        for dev, stream, busy in found:
            streams.setdefault(dev, []).append((stream, int(busy)))
    for rows in streams.values():
        rows.sort(key=lambda r: (-r[1], r[0] is None, r[0] or 0))  # busiest first, then by stream id
    bounds = _bounds(scope, params.buckets)
    devices = [_device(d, _busy_by_slice(slices[d], bounds), kernel_busy.get(d, 0), overlap.get(d, 0),
                       streams.get(d, []), scope, bounds, params.limit) for d in scope.devices]
    busy = pct(sum(d.busy_ns for d in devices), scope.duration_ns * len(devices))
    result = Result(scope=scope, busy_pct=busy, idle_pct=round(100 - busy, 2) if devices else 0.0,
                    bucket_count=params.buckets, bucket_ns=scope.duration_ns // params.buckets, devices=devices,
                    truncated=any(d.stream_count > params.limit for d in devices),
                    note=None if devices else NO_GPU_NOTE)
    return result


def render(result: Result) -> str:
    s = result.scope
    lines = [f"GPU utilization over {ms(s.duration_ns)} ({s.window_basis} window), "
             f"{result.bucket_count} slices of {ms(result.bucket_ns)}"]
    if result.note:
        lines.append(f"NOTE: {result.note}")
    for d in result.devices:
        lines.append(f"device {d.device}: busy {d.busy_pct:.1f}% ({ms(d.busy_ns)}), idle {ms(d.idle_ns)}, "
                     f"kernels {d.kernel_busy_pct:.1f}%, 2+ kernels at once {d.overlap_pct:.1f}%; idle "
                     f"{d.idle_pattern}: {d.idle_concentration_pct:.0f}% of it in the worst 20% of slices")
        lines.append("  timeline busy%: " + " ".join(f"{p:.0f}" for p in d.timeline_busy_pct))
        lines.extend(f"  stream {st.stream}: {st.busy_pct:.1f}% ({ms(st.busy_ns)})" for st in d.streams)
        if d.stream_count > len(d.streams):
            lines.append(f"  ... {d.stream_count - len(d.streams)} more streams: raise `limit` to see them")
    return "\n".join(lines)
