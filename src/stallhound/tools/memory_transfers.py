"""How much data moves between host and devices, how fast, from which memory, and does it stall the GPU?

Copies (memcpy rows) of the devices in scope whose start lies in the window, per direction (H2D, D2H,
D2D, P2P, ...; per device too with per_device). time_ns sums copy durations; bandwidth_gb_per_s = bytes /
time_ns; window_pct = time_ns / (window x devices). Host memory kind: pageable when either side is
pageable, else pinned when either side is pinned. exposed_time_ns = copy time during which the copying
device ran no kernel (copy interval minus the union of that device's kernels). Synchronous copy APIs:
traced copy calls whose name lacks 'Async' (cudaMemcpy, ...): distinct calls and their host duration.
Small D2H: D2H copies of rules.SMALL_READ_BYTES (1 KiB) or less, as the idle attribution's read-backs; blocking when
the call blocks the host (synchronous, or from pageable
memory: analysis/rules.py), or is followed by a sync call on the same thread starting within 100 us after it
returns (the .item() pattern; the idle attribution uses the same two rules);
blocked_ns = the copy call's duration, plus that sync's for an asynchronous copy (the idle time such reads
cost the devices is blocking-d2h-sync in gpu_idle_gaps).
Memsets (memset rows starting in the window): count, bytes, time, and those on managed memory (unified_memory
says whether page faults stall them); they count in triage's transfer share.
Findings, per device and disjoint: many small uploads (analysis/small_uploads.py) claim their host time in their calls
and the syncs after them while no kernel runs, or where larger the device's idle in them and the host's turnaround after
them (the attribution's small_copy, theirs where no other small pageable copy shares it) (excessive-h2d-transfers, tag
many-small: one copy per step removes those calls, pinned or not); pageable-host-memory (analysis/pageable_copies.py) is
about the pageable copies large enough to pay for their staging (rules.PAGEABLE_STAGED_BYTES or more: a smaller copy
costs its latency, pinned or not): it claims their exposed time that pinned memory would save (at the bandwidth measured
for pinned copies of that size, direction and device, else half of it; none of the copies already at the pinned
rate) plus the idle time of gaps the host spent in them (analysis/attribution.py), never more than those copies take:
the union of their transfers and their calls (pageable_span_ns), outside the small uploads' host time when that
finding fires; excessive-h2d-transfers claims the rest of the exposed H2D time (less what the small uploads claim),
and says which part pinning would save.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import duckdb
import numpy as np
from pydantic import BaseModel, Field, PrivateAttr

from stallhound.analysis import attribution, copy_exposure, cover, pageable_copies, rules, small_uploads
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
from stallhound.analysis.pageable_copies import Staged, bandwidth
from stallhound.analysis.small_uploads import SmallUploads
from stallhound.model.duck import one_row

PAGEABLE_MIN_COUNT = 3  # recurring pageable copies, not a one-time upload
PAGEABLE_MIN_BYTES = 1 << 20  # ... moving enough data for staging to matter
LARGE_COPY_PCT = 5.0  # one pageable copy this long (share of the window) matters however few there are
H2D_WINDOW_PCT = 5.0  # book excessive-h2d-transfers: H2D time above ~5% of the time
EXPOSED_SHARE = 0.5  # most of the H2D time with no kernel running: the copy is on the critical path
HOST_SIDE = ("H2D", "D2H", "H2H", "H2A", "A2H", "UVM_H2D", "UVM_D2H")
TRIAGE = TriageRole("window", order=3)


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
    pageable_exposed_ns: int = Field(description="the part of exposed_time_ns in pageable copies")


class Result(Output):
    scope: Scope
    copy_count: int
    copy_bytes: int
    copy_time_ns: int
    rows: list[DirectionRow]
    truncated: bool
    total_rows: int
    sync_copy_calls: int = Field(description="traced copy calls without 'Async' in the name")
    sync_copy_api_ns: int
    small_d2h_count: int = Field(description=f"D2H copies of <= {rules.SMALL_READ_BYTES} bytes")
    small_d2h_blocking: int = Field(description="those whose call blocked the host (synchronous or followed by a sync)")
    small_d2h_blocked_ns: int = Field(description="host time in those copy calls and their syncs")
    memset_count: int
    memset_bytes: int
    memset_time_ns: int
    managed_memset_count: int = Field(description="memsets on managed (unified) memory: see unified_memory")
    managed_memset_time_ns: int
    findings: list[Finding] = []
    _basis: _Basis | None = PrivateAttr(None)  # what findings() reads beyond the rows shown


@dataclass(frozen=True)
class _Basis:
    """The figures the findings are decided on: every (direction, device) row, the pageable copies' figures beyond
    a row, each device's idle time in pageable copies and in all (analysis/attribution.py), the time its pageable
    copies take (the union of their transfers and calls: no saving exceeds it) in all and outside the host time of
    its small uploads, and its small uploads with the steps in the window (where there are enough to count)."""
    rows: list[DirectionRow]
    pageable: dict[tuple[int, str], Staged]
    idle_ns: dict[int, int]
    device_idle_ns: dict[int, int]
    span_ns: dict[int, tuple[int, int]]
    small: dict[int, SmallUploads]


COPIES = """
WITH c AS (
  SELECT device_id, pid, correlation_id, direction, bytes, start_ns, end_ns, duration_ns, api_name, launch_start_ns,
         launch_end_ns,
         CASE WHEN 'pageable' IN (src_kind, dst_kind) THEN 'pageable'
              WHEN 'pinned' IN (src_kind, dst_kind) THEN 'pinned' END AS host_kind,
         """ + rules.staged_sql("bytes") + """ AS sized
  FROM memcpy WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end)"""

# Per (direction, device), for the copies starting in [$start, $end); exposed time comes from _exposed.
DIRECTIONS_SQL = COPIES + """
SELECT direction, device_id, count(*), coalesce(sum(bytes), 0), sum(duration_ns),
       count(*) FILTER (WHERE host_kind = 'pageable'), coalesce(sum(bytes) FILTER (WHERE host_kind = 'pageable'), 0),
       coalesce(sum(duration_ns) FILTER (WHERE host_kind = 'pageable'), 0),
       count(*) FILTER (WHERE host_kind = 'pinned'), coalesce(sum(bytes) FILTER (WHERE host_kind = 'pinned'), 0),
       coalesce(sum(duration_ns) FILTER (WHERE host_kind = 'pinned'), 0)
FROM c GROUP BY ALL
"""
PAGEABLE_SQL = COPIES + """,
s AS (SELECT *, host_kind = 'pageable' AND sized AS staged FROM c)
SELECT device_id, direction, count(*) FILTER (WHERE staged), coalesce(sum(bytes) FILTER (WHERE staged), 0),
       coalesce(sum(duration_ns) FILTER (WHERE staged), 0), coalesce(max(duration_ns) FILTER (WHERE staged), 0),
       count(*) FILTER (WHERE staged AND api_name LIKE '%Async%'),
       coalesce(sum(bytes) FILTER (WHERE host_kind = 'pinned' AND sized), 0),
       coalesce(sum(duration_ns) FILTER (WHERE host_kind = 'pinned' AND sized), 0),
       count(*) FILTER (WHERE host_kind = 'pageable' AND NOT sized)
FROM s WHERE host_kind IS NOT NULL GROUP BY ALL
"""

# Each staged pageable copy from its call's start (or its own) to its end (or the call's), clipped to the window.
PAGEABLE_SPANS_SQL = COPIES + """
SELECT device_id, greatest(least(start_ns, coalesce(launch_start_ns, start_ns)), $start) AS s,
       least(greatest(end_ns, coalesce(launch_end_ns, end_ns)), $end) AS e
FROM c WHERE host_kind = 'pageable' AND sized ORDER BY 1
"""
MEMSETS_SQL = """
SELECT count(*), coalesce(sum(bytes), 0), coalesce(sum(least(end_ns, $end) - start_ns), 0),
       count(*) FILTER (WHERE mem_kind IN ('managed', 'managed_static')),
       coalesce(sum(least(end_ns, $end) - start_ns) FILTER (WHERE mem_kind IN ('managed', 'managed_static')), 0)
FROM memset WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end
"""

SYNC_COPY_SQL = COPIES + """
SELECT count(*), coalesce(sum(duration_ns), 0) FROM (
  SELECT DISTINCT a.pid, a.correlation_id, a.duration_ns FROM c
  JOIN cuda_api a ON a.pid = c.pid AND a.correlation_id = c.correlation_id AND a.kind = 'memcpy'
  WHERE c.api_name NOT LIKE '%Async%')
"""

SMALL_D2H_SQL = COPIES + """,
small AS (
  SELECT c.host_kind = 'pageable' AS pageable, a.pid, a.tid, a.name, a.end_ns, a.duration_ns FROM c
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
FROM (SELECT *, name LIKE '%Async%' AS is_async,
             name IS NOT NULL AND (""" + rules.blocking_copy_sql("name", "coalesce(pageable, false)") + """ OR synced)
               AS blocking
      FROM followed)
"""


def _row(direction: str, device: int | None, sums: tuple, capacity: int) -> DirectionRow:
    """A row from DIRECTIONS_SQL's sums (count, bytes, ns, pageable count/bytes/ns, pinned count/bytes/ns) and
    _exposed's (exposed, pageable exposed)."""
    n, nbytes, ns, pg_n, pg_b, pg_ns, pin_n, pin_b, pin_ns, exposed, pg_exposed = (int(v) for v in sums)
    return DirectionRow(
        direction=direction, device=device, count=n, bytes=nbytes, time_ns=ns,
        bandwidth_gb_per_s=bandwidth(nbytes, ns), window_pct=pct(ns, capacity), pageable_count=pg_n,
        pageable_bytes=pg_b, pageable_time_ns=pg_ns, pageable_bandwidth_gb_per_s=bandwidth(pg_b, pg_ns),
        pinned_count=pin_n, pinned_bytes=pin_b, pinned_time_ns=pin_ns,
        pinned_bandwidth_gb_per_s=bandwidth(pin_b, pin_ns), exposed_time_ns=exposed,
        exposed_pct=pct(exposed, ns), pageable_exposed_ns=pg_exposed)


def _costliest_first(row: DirectionRow) -> tuple:
    return -row.time_ns, row.direction, -1 if row.device is None else row.device


def _added(total: tuple[int, ...] | None, figures: tuple) -> tuple[int, ...]:
    """Figures summed position by position (None: nothing yet)."""
    return tuple(int(b) for b in figures) if total is None else tuple(
        a + int(b) for a, b in zip(total, figures, strict=True))


def _by_direction(sums: dict[tuple[str, int], tuple], capacity: int) -> list[DirectionRow]:
    """One row per direction over the devices, from the (direction, device) sums."""
    merged: dict[str, tuple[int, ...]] = {}
    for (direction, _), figures in sums.items():
        merged[direction] = _added(merged.get(direction), figures)
    return [_row(direction, None, figures, capacity) for direction, figures in merged.items()]


def _directions(con: duckdb.DuckDBPyConnection, args: dict
                ) -> tuple[dict[tuple[str, int], tuple[int, ...]], dict[tuple[str, int], int]]:
    """DIRECTIONS_SQL's figures per (direction, device), then the exposed time and its pageable part; and apart, the
    exposed time of the staged pageable copies (copy_exposure)."""
    sums = {(direction, device): tuple(int(v) for v in figures)
            for direction, device, *figures in con.execute(DIRECTIONS_SQL, args).fetchall()}
    exposed = copy_exposure.exposed(con, args, sorted({direction for direction, _ in sums}))
    return {key: figures + exposed[key][:2] for key, figures in sums.items()}, {k: e[2] for k, e in exposed.items()}


def small_d2h(con: duckdb.DuckDBPyConnection, scope: Scope) -> tuple[int, int, int]:
    """(small D2H copies, blocking ones, host ns blocked) in scope."""
    args = {**scope_args(scope), "small_bytes": rules.SMALL_READ_BYTES, "follow": rules.READBACK_FOLLOW_NS}
    row = one_row(con.execute(SMALL_D2H_SQL, args))
    count, blocking, blocked = row
    return count, blocking, int(blocked)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    args = scope_args(scope)
    sums, staged_exposed = _directions(con, args)
    per_device = sorted((_row(direction, device, figures, scope.duration_ns)
                         for (direction, device), figures in sums.items()), key=_costliest_first)
    shown = per_device if params.per_device else sorted(
        _by_direction(sums, scope.duration_ns * max(len(scope.devices), 1)), key=_costliest_first)
    count, nbytes, ns = (sum(f[i] for f in sums.values()) for i in range(3))  # every copy is in one row of sums
    sync = one_row(con.execute(SYNC_COPY_SQL, args))
    sync_calls, sync_ns = sync
    small, blocking, blocked = small_d2h(con, scope)
    sets, set_bytes, set_ns, managed, managed_ns = (int(v) for v in one_row(con.execute(MEMSETS_SQL, args)))
    result = Result(
        scope=scope, copy_count=count, copy_bytes=int(nbytes), copy_time_ns=int(ns), rows=shown[:params.limit],
        truncated=len(shown) > params.limit, total_rows=len(shown), sync_copy_calls=sync_calls,
        sync_copy_api_ns=int(sync_ns), small_d2h_count=small, small_d2h_blocking=blocking,
        small_d2h_blocked_ns=blocked, memset_count=sets, memset_bytes=set_bytes, memset_time_ns=set_ns,
        managed_memset_count=managed, managed_memset_time_ns=managed_ns)
    link = pageable_copies.at_link(con, args)
    pageable = {(d, dr): Staged(**dict(zip(Staged.model_fields, figures, strict=False)),
                                   exposed_ns=staged_exposed.get((dr, d), 0), at_link_ns=link.get((d, dr), 0))
                for d, dr, *figures in con.execute(PAGEABLE_SQL, args).fetchall()}
    idle = attribution.attribute(con, scope).devices if count else {}
    uploads = small_uploads.figures(con, scope, resolve_scope(con, ScopedParams(
        profile=params.profile, device=params.device)), {d: i.ns("small_copy") for d, i in idle.items()})
    result._basis = _Basis(per_device, pageable, {d: i.ns("pageable_copy") for d, i in idle.items()},
                           {d: i.idle_ns for d, i in idle.items()}, _spans(con, args, uploads), uploads)
    return result


def _spans(con: duckdb.DuckDBPyConnection, args: dict, small: dict[int, SmallUploads]
           ) -> dict[int, tuple[int, int]]:
    """Per device, the union of its pageable copies' transfers and calls in the window (PAGEABLE_SPANS_SQL), in all
    and outside its small uploads' host time."""
    spans = con.execute(PAGEABLE_SPANS_SQL, args).fetchnumpy()
    out = {}
    for device in np.unique(spans["device_id"]).tolist():
        mine = spans["device_id"] == device
        starts, ends = cover.islands(spans["s"][mine].astype(np.int64), spans["e"][mine].astype(np.int64))
        total = int((ends - starts).sum())
        owned = int(cover.covered(starts, ends, *small[device].islands).sum()) if device in small else 0
        out[int(device)] = (total, total - owned)
    return out


def findings(result: Result) -> list[Finding]:
    """Per device: excessive-h2d-transfers for many small uploads (their host time while no kernel runs), then
    pageable-host-memory (recurring pageable copies, or one long one, or idle spent in them) outside that time,
    then excessive-h2d-transfers (H2D time above 5% of the window) for the exposed H2D time left."""
    b = result._basis
    return _findings(b, result.scope.duration_ns) if b else []


def _findings(b: _Basis, window_ns: int) -> list[Finding]:
    out = []
    idle_ns = b.idle_ns
    for device, mine in _by_device(b.rows):
        batched = small_uploads.finding(device, b.small.get(device), b.device_idle_ns.get(device, 0), window_ns)
        span = b.span_ns.get(device, (0, 0))[1 if batched else 0]  # the small uploads' host time is batched's
        sized = {dr: x for (d, dr), x in sorted(b.pageable.items()) if d == device and dr in HOST_SIDE}
        host = {dr: x for dr, x in sized.items() if x.count}
        saving = {dr: pageable_copies.saving(x) for dr, x in host.items()}
        stake = min(sum(saving.values()) + idle_ns.get(device, 0), span)
        largest = max((x.largest_ns for x in host.values()), default=0)
        recurring = any(x.count >= PAGEABLE_MIN_COUNT and x.bytes >= PAGEABLE_MIN_BYTES for x in host.values())
        large = pct(largest, window_ns) >= LARGE_COPY_PCT
        pinned = (recurring or large or idle_ns.get(device, 0)) and rules.worth_reporting(stake, window_ns)
        if pinned:
            tags = (["large-single"] if large and not recurring else []) + (
                ["async-blocking"] if any(x.async_count for x in host.values()) else [])
            small = sum(x.small_count for x in sized.values())
            out.append(pageable_copies.finding(device, host, (stake, idle_ns.get(device, 0), span), small, tags))
        owned = saving.get("H2D", 0) if pinned else 0  # pageable-host-memory owns what pinning saves of these copies
        taken = owned + (batched.time_at_stake_ns if batched else 0)
        out += [batched] if batched else []
        out += [_h2d_finding(device, r, owned, taken, window_ns) for r in mine
                if r.direction == "H2D" and r.window_pct >= H2D_WINDOW_PCT
                and rules.worth_reporting(r.exposed_time_ns - taken, window_ns)]
    return out


def _by_device(rows: list[DirectionRow]) -> list[tuple[int, list[DirectionRow]]]:
    """The rows of each device, in device order."""
    mine: dict[int, list[DirectionRow]] = {}
    for r in rows:
        assert r.device is not None  # findings are decided on the per-device rows
        mine.setdefault(r.device, []).append(r)
    return sorted(mine.items())


def _h2d_finding(device: int, r: DirectionRow, pinned_ns: int, taken_ns: int, window_ns: int) -> Finding:
    """pinned_ns: the part of the exposed H2D time that pageable-host-memory claims on this device; taken_ns: that
    and the time at stake of its many small uploads."""
    stake = r.exposed_time_ns - taken_ns
    cited = (f"; pinning saves ~{ms(pinned_ns)} of it (pageable-host-memory), moving less data the rest"
             if pinned_ns else "")
    return Finding(
        root_cause="excessive-h2d-transfers", severity="high" if r.exposed_pct >= 100 * EXPOSED_SHARE else "medium",
        title=f"device {device}: H2D copies take {r.window_pct:.1f}% of the window ({r.bytes / 2**30:,.2f} GiB at "
              f"{r.bandwidth_gb_per_s} GB/s), {r.exposed_pct:.0f}% of it with no kernel running{cited}",
        evidence={"count": r.count, "bytes": r.bytes, "time_ns": r.time_ns, "window_pct": r.window_pct,
                  "exposed_time_ns": r.exposed_time_ns, "pinned_bytes": r.pinned_bytes,
                  "pageable_bytes": r.pageable_bytes, "pinned_saving_ns": pinned_ns},
        time_at_stake_ns=stake, device=device, tags=["pinned" if r.pinned_bytes >= r.pageable_bytes else "pageable"])


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
        lines.extend(more_rows(result, result.total_rows - len(result.rows), "rows"))
    lines.append(f"synchronous copy calls: {result.sync_copy_calls} ({ms(result.sync_copy_api_ns)}); small D2H: "
                 f"{result.small_d2h_count}, {result.small_d2h_blocking} blocking ({ms(result.small_d2h_blocked_ns)})")
    if result.memset_count:
        lines.append(f"memsets: {result.memset_count:,}, {result.memset_bytes / 2**20:,.1f} MiB, "
                     f"{ms(result.memset_time_ns)}; {result.managed_memset_count:,} on managed memory "
                     f"({ms(result.managed_memset_time_ns)}: unified_memory says whether page faults stall them)")
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
