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

from stallhound.analysis.common import DEFAULT_LIMIT, LimitParam, Output, Scope, ScopedParams, ms, pct, resolve_scope
from stallhound.analysis.device_pass import DEFAULT_SLICES, DevicePass, device_passes
from stallhound.formats.remedy import remedy

NO_GPU_NOTE = ("the profile has no GPU activity (no kernel, memcpy or memset), so there is no utilization to "
               "measure; re-capture with {capture}")
WORST_SHARE = 0.2  # fraction of slices whose idle time idle_concentration_pct measures
CONCENTRATED_PCT = 50.0  # half the idle time in the worst fifth of slices: a few long stalls, not jitter
MIN_BUCKETS_FOR_PATTERN = 5  # with fewer slices "worst 20%" is a single slice and says nothing


class Params(ScopedParams):
    buckets: Annotated[int, Field(description="Number of equal time slices in the timeline (1-200)",
                                  ge=1, le=200)] = DEFAULT_SLICES
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


def _device(device: int, work: DevicePass, scope: Scope, bounds: list[int], limit: int) -> DeviceUtilization:
    streams = sorted(work.streams.items(), key=lambda r: (-r[1], r[0] is None, r[0] or 0))  # busiest first
    busy_by_slice, kernel_busy, overlap = _busy_by_slice(work.slices, bounds), work.kernel_busy, work.overlap
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
    passes = device_passes(con, scope, params.buckets)
    bounds = _bounds(scope, params.buckets)
    devices = [_device(d, passes.get(d, DevicePass()), scope, bounds, params.limit) for d in scope.devices]
    busy = pct(sum(d.busy_ns for d in devices), scope.duration_ns * len(devices))
    result = Result(scope=scope, busy_pct=busy, idle_pct=round(100 - busy, 2) if devices else 0.0,
                    bucket_count=params.buckets, bucket_ns=scope.duration_ns // params.buckets, devices=devices,
                    truncated=any(d.stream_count > params.limit for d in devices),
                    note=None if devices else NO_GPU_NOTE.format(capture=remedy(con, ('kernels',))))
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
