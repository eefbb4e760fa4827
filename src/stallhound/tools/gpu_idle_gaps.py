"""Where does each GPU sit idle, for how long, and why?

Over the window (default: GPU-active), a device is idle where none of its kernels, copies or memsets runs
(the union of their intervals); every idle stretch (a gap, including the stretches before the device's first
and after its last operation) gets one cause from analysis/attribution.py, which says how each is decided (a gap
begun inside a blocking call whose host resumed late gives that late part, late_ns, a second cause; so does the
part of a jit or profiler gap in which no load, compile or profiler flush ran; the end of a gap spent inside the
blocking copy call whose transfer ends it, lead_ns, is that copy's; its wait there past the transfer's time, stall_ns,
a stall in the call).
devices: per device busy_pct = 1 - idle / window, idle by cause over all gaps (ns, gap count, the blocking
API for the blocking causes), and the gaps of at least min_gap_ns (count, time, largest).
gaps: the longest gaps of at least min_gap_ns, with the kernels before and after (within 1 s), the blocking
call the host was in when the device ran dry, and nvtx = up to 3 of the shortest NVTX ranges of the gap's host
thread (see analysis/attribution.py) that cover at least half the gap.
periodic_groups: gaps of similar length (within 20%) recurring at a steady period (>= 3 gaps, 75% of intervals
within 20% of the median), the costliest 5. Findings: every idle root cause (analysis/idle_causes.py). Times in ns.
The queries are analysis/gap_stages.py's: find -> group -> enrich the longest.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import duckdb
from pydantic import BaseModel, Field, PrivateAttr

from stallhound.analysis import attribution, gap_stages, idle_causes
from stallhound.analysis.common import (
    FINDINGS_SHOWN,
    Finding,
    LimitParam,
    OffsetParam,
    Paged,
    Scope,
    ScopedParams,
    leads_first,
    more_rows,
    ms,
    next_page,
    pct,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.idle_causes import IdleBasis
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row

GAP_ROWS = 8  # default rows: the longest gaps tell the story; totals, histogram and groups cover all
PERIODIC_ROWS = 5  # a pattern recurs on every rank of a node: the costliest few make the point
BUCKETS_MS = ((0, 1), (1, 2), (2, 5), (5, 10), (10, 50), (50, 100), (100, None))  # histogram, ms
TRIAGE = TriageRole("idle", order=2)  # triage ranks every idle finding of its window, as this tool lists them


class Params(ScopedParams):
    min_gap_ns: Annotated[int, Field(description="Shortest idle stretch listed, ns (causes cover all gaps)",
                                     ge=1000)] = 1_000_000
    limit: LimitParam = GAP_ROWS
    offset: OffsetParam = 0


class CauseRow(BaseModel):
    cause: str = Field(description="see analysis/attribution.py: queued, sync, readback, pageable_copy, small_copy, "
                                   "sync_copy, call_stall, host_fault, launch_tiny, launch, jit, alloc, init, "
                                   "host_comm, input_wait, host_wait, host_cpu, host_op, host_python, host_untraced")
    idle_ns: int
    gaps: int
    api: str | None = Field(description="blocking API most often seen, for the blocking causes")


class DeviceGaps(BaseModel):
    device: int
    busy_pct: float
    idle_ns: int
    by_cause: list[CauseRow] = Field(description="all idle time by cause, largest first")
    gap_count: int = Field(description="gaps of at least min_gap_ns")
    gap_time_ns: int
    gap_window_pct: float
    largest_ns: int


class Gap(BaseModel):
    device: int
    start_ns: int
    end_ns: int
    duration_ns: int
    cause: str
    blocked_in: str | None = Field(description="blocking API the host was inside when the device ran dry (or, for a "
                                                           "short gap, had returned from before its next launch)")
    late_ns: int = Field(description="for a gap begun inside a blocking call: the time the host resumed late, past "
                                     "the call's share (its return + 1 ms turnaround); for a jit or profiler gap: "
                                     "the time no load, compile or profiler flush ran; charged to late_cause")
    late_cause: str | None = Field(description="the cause of late_ns (what the host did meanwhile), else null")
    then_ns: int = Field(0, description="for a gap begun inside a blocking call of another cause: the time of the "
                                        "host activity (allocation, communication, loader, waits, jit, profiler) "
                                        "after the call's share; charged to then_cause")
    then_cause: str | None = Field(None, description="the cause of then_ns, else null")
    lead_ns: int = Field(0, description="at the gap's end: the time the host sat in the blocking copy call whose "
                                        "transfer ends the gap, begun in it (a pageable copy's staging, a "
                                        "synchronous copy's latency); charged to lead_cause")
    lead_cause: str | None = Field(None, description="the cause of lead_ns (the copy call's), else null")
    stall_ns: int = Field(0, description="before lead_ns: the time the host sat in that call 1 ms or more past its "
                                         "transfer's time, launching and moving nothing (cause call_stall)")
    kernel_before: str | None
    kernel_after: str | None
    nvtx: list[str] = Field(description="innermost NVTX ranges of the launching threads covering half the gap")
    periodic: bool
    edge: bool = Field(description="touches the window's start or end: the stretch before the device's first or "
                                   "after its last operation, or a gap the window cuts")


class Bucket(BaseModel):
    label: str
    count: int
    total_ns: int


class PeriodicGroup(BaseModel):
    device: int
    count: int
    mean_duration_ns: int
    period_ns: int
    total_ns: int
    first_start_ns: int
    cause: str = Field(description="the most common cause of its gaps")


class Result(Paged):
    page_field = "gaps"
    scope: Scope
    min_gap_ns: int
    gap_count: int = Field(description="gaps of at least min_gap_ns, all devices")
    gap_time_ns: int
    devices: list[DeviceGaps]
    histogram: list[Bucket] = Field(description="gaps of at least min_gap_ns in log buckets (ms)")
    periodic_groups: list[PeriodicGroup] = Field(description=f"costliest first, at most {PERIODIC_ROWS}")
    periodic_group_count: int
    gaps: list[Gap] = Field(description="longest first: `limit` gaps from `offset`")
    truncated: bool
    note: str | None = Field(default=None, description="what the causes cannot show here")
    findings: list[Finding] = Field([], description=f"at most {FINDINGS_SHOWN}, costliest first, each root cause's "
                                                    "costliest before per-device repeats (triage ranks them all)")
    findings_total: int = 0  # idle findings in the window, before the cut to the costliest
    _idle: IdleBasis | None = PrivateAttr(None)  # what findings() reads: the window's idle attribution, not shown


TRACED_SQL = """SELECT count(*) FROM kernels WHERE tid IS NOT NULL AND device_id IN (SELECT unnest($devices))
                AND end_ns > $start AND start_ns < $end"""


def _device(idle: attribution.DeviceIdle, found: list[attribution.Gap]) -> DeviceGaps:
    rows = sorted(idle.causes.items(), key=lambda kv: (-kv[1].ns, kv[0]))
    by_cause = [CauseRow(cause=c, idle_ns=t.ns, gaps=t.gaps, api=t.api)
                for c, t in rows]
    lengths = [g.end_ns - g.start_ns for g in found]
    return DeviceGaps(device=idle.device, busy_pct=idle.busy_pct, idle_ns=idle.idle_ns, by_cause=by_cause,
                      gap_count=len(lengths), gap_time_ns=sum(lengths),
                      gap_window_pct=pct(sum(lengths), idle.window_ns), largest_ns=max(lengths, default=0))


def _histogram(found: list[attribution.Gap]) -> list[Bucket]:
    counts: dict[int, list[int]] = {}
    for g in found:
        n = g.end_ns - g.start_ns
        index = sum(n >= lo * 1_000_000 for lo, _ in BUCKETS_MS[1:])
        counts.setdefault(index, []).append(n)
    return [Bucket(label=f">={BUCKETS_MS[i][0]} ms" if BUCKETS_MS[i][1] is None else
                   f"{BUCKETS_MS[i][0]}-{BUCKETS_MS[i][1]} ms", count=len(v), total_ns=sum(v))
            for i, v in sorted(counts.items())]


def _group(row: dict, by_id: dict[int, attribution.Gap]) -> PeriodicGroup:
    causes = Counter(by_id[i].cause for i in row.pop("gap_ids"))
    return PeriodicGroup(**row, cause=max(sorted(causes), key=lambda c: causes[c]))


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params, default="gpu_active")
    attr = attribution.attribute(con, scope)
    found = gap_stages.find(con, scope, params.min_gap_ns)
    groups = gap_stages.group(con, found)
    periodic = {i for g in groups for i in g["gap_ids"]}
    top = gap_stages.longest(found, params.offset + params.limit)[params.offset:]
    more = len(found) > params.offset + params.limit
    around = gap_stages.enrich(con, top)
    gaps = [Gap(device=g.device, start_ns=g.start_ns, end_ns=g.end_ns, duration_ns=g.end_ns - g.start_ns,
                cause=g.cause, blocked_in=g.blocked_in, late_ns=g.late_ns, late_cause=g.late_cause,
                then_ns=g.then_ns, then_cause=g.then_cause, lead_ns=g.lead_ns, lead_cause=g.lead_cause,
                stall_ns=g.stall_ns, **around[g.gap_id], periodic=g.gap_id in periodic,
                edge=g.at_edge(scope)) for g in top]
    by_id = {g.gap_id: g for g in found}
    devices = [_device(attr.devices[d], [g for g in found if g.device == d]) for d in scope.devices]
    traced = one_row(con.execute(TRACED_SQL, scope_args(scope)))
    note = None if traced[0] else ("no kernel in scope has a traced launch call, so causes read 'host_untraced'; "
                                f"capture with {remedy(con, ('cuda_api',))} to see what the host did")
    result = Result(scope=scope, min_gap_ns=params.min_gap_ns, gap_count=len(found),
                    gap_time_ns=sum(d.gap_time_ns for d in devices), devices=devices, histogram=_histogram(found),
                    periodic_groups=[_group(g, by_id) for g in groups[:PERIODIC_ROWS]],
                    periodic_group_count=len(groups), gaps=gaps,
                    truncated=more, note=note, offset=params.offset,
                    next_offset=next_page(params.offset, len(gaps), more))
    result._idle = _basis(con, scope, params.device)
    result.findings_total = len(result._idle.findings())
    return result


def _basis(con: duckdb.DuckDBPyConnection, scope: Scope, device: int | None) -> IdleBasis:
    """The window's idle attribution, the program and its loop's step: what the idle findings follow from."""
    return idle_causes.basis(con, scope, idle_causes.step_ns(con, scope.profile, device))


def window_findings(con: duckdb.DuckDBPyConnection, scope: Scope, device: int | None, in_loop: bool) -> list[Finding]:
    """Every idle finding of the window, not only the costliest this tool shows: what triage ranks (its TRIAGE
    role); in_loop when the window lies inside the program's loop (see idle_causes.findings)."""
    return _basis(con, scope, device).findings(in_loop)


def findings(result: Result) -> list[Finding]:
    """Every idle root cause of the window (analysis/idle_causes.py), the costliest FINDINGS_SHOWN."""
    return leads_first(result._idle.findings(), lambda f: f, FINDINGS_SHOWN) if result._idle else []


def render(result: Result) -> str:
    s = result.scope
    lines = [f"{result.gap_count} idle gaps >= {ms(result.min_gap_ns)} over {ms(s.duration_ns)} ({s.window_basis} "
             f"window): {ms(result.gap_time_ns)}"]
    for d in result.devices:
        causes = ", ".join(f"{c.cause} {ms(c.idle_ns)}" for c in d.by_cause[:5])
        lines.append(f"device {d.device}: busy {d.busy_pct:.1f}%, idle {ms(d.idle_ns)} ({causes or 'none'}); "
                     f"{d.gap_count} gaps >= min, largest {ms(d.largest_ns)}")
    if result.histogram:
        lines.append("histogram: " + ", ".join(f"{b.label}: {b.count}" for b in result.histogram))
    lines.extend(f"periodic: dev {g.device} {g.count} x ~{ms(g.mean_duration_ns)} every {ms(g.period_ns)} ({g.cause})"
                 for g in result.periodic_groups)
    if result.periodic_group_count > len(result.periodic_groups):
        lines.append(f"... {result.periodic_group_count - len(result.periodic_groups)} more periodic groups")
    for g in result.gaps:
        blocked = f" in {g.blocked_in}" if g.blocked_in else ""
        if g.then_ns:
            blocked += f" for {ms(g.duration_ns - g.then_ns - g.late_ns)}, {ms(g.then_ns)} {g.then_cause}"
        if g.late_ns and (g.cause in attribution.SHARE_CAUSES or g.then_ns):
            blocked += f"{'' if g.then_ns else ' for ' + ms(g.duration_ns - g.late_ns)}, {ms(g.late_ns)} {g.late_cause}"
        elif g.late_ns:
            blocked += f", then {ms(g.late_ns)} late resume ({g.late_cause})"
        if g.stall_ns:
            blocked += f", then {ms(g.stall_ns)} stalled in a copy call (call_stall)"
        if g.lead_ns:
            blocked += f", then {ms(g.lead_ns)} in a copy call ({g.lead_cause})"
        lines.append(f"{ms(g.duration_ns):>14} dev {g.device} at {g.start_ns}: {g.cause}{blocked}"
                     f"{' (periodic)' if g.periodic else ''}; {g.kernel_before or '-'} -> {g.kernel_after or '-'}"[:200]
                     + (f"; nvtx {' < '.join(g.nvtx)}" if g.nvtx else ""))
    if result.truncated:
        lines.extend(more_rows(result, result.rows_after(result.gap_count), "gaps"))
    if result.note:
        lines.append(f"note: {result.note}")
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    if result.findings_total > len(result.findings):
        lines.append(f"... {result.findings_total - len(result.findings)} smaller findings: triage ranks them all")
    return "\n".join(lines)
