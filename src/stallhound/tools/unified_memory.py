"""Does unified (managed) memory migrate on demand, and what does that cost the devices?

Migrations: memcpy rows with a UVM_* direction (nsys' "Unified Host-to-Device/Device-to-Host" copy kinds) of the
devices in scope whose start lies in the window, per (device, direction, migration_cause). On demand: migrations
a page fault caused (page_fault), the driver's speculative prefetches around faults, evictions and access-counter
migrations; user_prefetch rows are the program's own prefetch calls. A migration of unknown cause (an export that
does not record causes) counts as on demand only when the processes in scope made no prefetch call in the window.
Per device: on_demand_ns = the union of its on-demand migrations, clipped to the window; exposed_ns = the part of
it with no kernel of the device running; faulting_memsets = memsets on managed memory that overlap an on-demand
migration or a GPU fault group (a memset on managed memory faults its pages in), stalled_memset_ns = their time
outside the migrations, less the work they would do at the device's own memset bandwidth on device memory
(measured in the window; without that reference they add nothing), host_stall_ns = the device's idle time between
migrations a host thread's touch caused (the idle attribution's host_fault: the host reads managed memory that lives
on the device page by page, stalled in faults, not computing or launching). Faults: uvm_faults rows starting in the
window, host faults of the processes in scope and GPU fault counts of the devices in scope (null when the
capture did not record faults). Calls overlapping the window (a prefetch that starts the window's first migration
begins before it) by the processes in scope: prefetches (cudaMemPrefetchAsync,
cuMemPrefetchAsync) and advice (cudaMemAdvise, cuMemAdvise); managed allocations (cudaMallocManaged,
cuMemAllocManaged) over the whole capture.
Finding unified-memory-migration, per device, when on-demand migrations recur and cost time worth reporting: a
fault stalls the kernel, memset or host thread that touched the page until the page has moved, so the migrations
lie on the critical path whether a kernel runs meanwhile or not. Time at stake = on_demand_ns + stalled_memset_ns +
host_stall_ns: never more than the time of the migrations, of the memsets they stall and of the device's idle between
the pages the host faulted in, in the window (disjoint: two kinds of busy time and idle time).
"""

from __future__ import annotations

import duckdb
import numpy as np
from pydantic import BaseModel, Field

from stallhound.analysis import attribution, cover, rules
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
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row

ON_DEMAND = ("page_fault", "speculative_prefetch", "eviction", "access_counters")  # the driver moved the pages
MIN_ON_DEMAND = 3  # a first touch migrates a buffer once or twice; three or more in the window recur
PREFETCH_CALLS = r"^cu(da)?MemPrefetch"  # cudaMemPrefetchAsync, cuMemPrefetchAsync (and their batch forms)
ADVISE_CALLS = r"^cu(da)?MemAdvise"
MANAGED_ALLOC_CALLS = r"^(cudaMallocManaged|cuMemAllocManaged)"
TRIAGE = TriageRole("window", order=6)


class Params(ScopedParams):
    limit: LimitParam = DEFAULT_LIMIT


class MigrationRow(BaseModel):
    device: int
    direction: str = Field(description="UVM_H2D (to the device), UVM_D2H (to the host), UVM_D2D")
    cause: str = Field(description="user_prefetch, page_fault, speculative_prefetch, eviction, access_counters, "
                                   "unknown")
    on_demand: bool
    count: int
    bytes: int
    time_ns: int


class DeviceRow(BaseModel):
    device: int
    on_demand_count: int
    on_demand_bytes: int
    on_demand_ns: int = Field(description="union of the on-demand migrations in the window")
    exposed_ns: int = Field(description="the part of on_demand_ns with no kernel running")
    gpu_faults: int | None = Field(description="GPU page faults recorded; null when faults were not captured")
    faulting_memsets: int = Field(description="memsets on managed memory overlapping on-demand migrations or faults")
    faulting_memset_ns: int
    stalled_memset_ns: int = Field(description="their time outside the migrations beyond their own work at the "
                                               "device's memset bandwidth on device memory (0 without that)")
    memset_gb_per_s: float | None = Field(description="the device's memsets on device memory in the window")
    host_stall_ns: int = Field(description="the device's idle time between migrations a host thread's touch caused "
                                           "(the host faulting pages in)")


class Result(Output):
    scope: Scope
    migration_count: int
    migration_bytes: int
    migration_time_ns: int
    on_demand_count: int
    rows: list[MigrationRow]
    truncated: bool
    total_rows: int
    devices: list[DeviceRow]
    cpu_faults: int | None = Field(description="host page faults on managed memory; null when not captured")
    prefetch_calls: int
    advise_calls: int
    managed_alloc_calls: int = Field(description="over the whole capture")
    capture_faults: str | None = Field(description="how to record the page faults, when the capture lacks them")
    findings: list[Finding] = []


PROCESSES = """procs AS (SELECT DISTINCT pid FROM (SELECT pid, device_id FROM kernels UNION ALL
  SELECT pid, device_id FROM memcpy UNION ALL SELECT pid, device_id FROM memset)
  WHERE device_id IN (SELECT unnest($devices)))"""
MIGRATIONS_SQL = """
SELECT device_id, direction, coalesce(migration_cause, 'unknown'), count(*), sum(bytes),
       sum(least(end_ns, $end) - start_ns)
FROM memcpy WHERE direction LIKE 'UVM%' AND device_id IN (SELECT unnest($devices))
  AND start_ns >= $start AND start_ns < $end
GROUP BY ALL ORDER BY 6 DESC, 1, 2, 3
"""
CALLS_SQL = "WITH " + PROCESSES + """
SELECT count(*) FILTER (WHERE regexp_matches(name, $prefetch) AND end_ns > $start AND start_ns < $end),
       count(*) FILTER (WHERE regexp_matches(name, $advise) AND end_ns > $start AND start_ns < $end),
       count(*) FILTER (WHERE regexp_matches(name, $managed))
FROM cuda_api WHERE pid IN (SELECT pid FROM procs)
"""
CPU_FAULTS_SQL = "WITH " + PROCESSES + """
SELECT count(*) FROM uvm_faults WHERE side = 'cpu' AND pid IN (SELECT pid FROM procs)
  AND start_ns >= $start AND start_ns < $end
"""
# One device's intervals starting in the window, clipped to it: its on-demand migrations (kind 0), GPU fault groups
# (1), memsets on managed memory (2) and on device memory (4, bytes and time: the reference bandwidth), and the kernels
# (3) overlapping the span of those migrations (a kernel that began before the window included).
INTERVALS_SQL = """
WITH mine AS (
  SELECT start_ns AS s, end_ns AS e, 0 AS kind, bytes FROM memcpy
  WHERE device_id = $device AND direction LIKE 'UVM%' AND start_ns >= $start AND start_ns < $end
    AND (migration_cause IN (SELECT unnest($causes)) OR (coalesce(migration_cause, 'unknown') = 'unknown' AND $unknown))
  UNION ALL SELECT start_ns, end_ns, 1, faults FROM uvm_faults
  WHERE side = 'gpu' AND device_id = $device AND start_ns >= $start AND start_ns < $end
  UNION ALL SELECT start_ns, end_ns, CASE WHEN mem_kind IN ('managed', 'managed_static') THEN 2 ELSE 4 END, bytes
  FROM memset WHERE device_id = $device AND start_ns >= $start AND start_ns < $end),
span AS (SELECT min(s) AS lo, max(e) AS hi FROM mine WHERE kind = 0)
SELECT greatest(s, $start) AS s, least(e, $end) AS e, kind, bytes FROM (
  SELECT * FROM mine UNION ALL SELECT k.start_ns, k.end_ns, 3, 0 FROM kernels k, span
  WHERE k.device_id = $device AND k.end_ns > span.lo AND k.start_ns < span.hi)
WHERE e > s
"""
GPU_FAULTS_SQL = """
SELECT coalesce(sum(faults), 0) FROM uvm_faults
WHERE side = 'gpu' AND device_id = $device AND start_ns >= $start AND start_ns < $end
"""


def _union(s: np.ndarray, e: np.ndarray) -> int:
    starts, ends = cover.islands(s, e)
    return int((ends - starts).sum())


def _device(con: duckdb.DuckDBPyConnection, args: dict, device: int, faults_recorded: bool,
            host_stall_ns: int) -> DeviceRow:
    """One device's on-demand figures from INTERVALS_SQL."""
    mine = {**args, "device": device}
    r = con.execute(INTERVALS_SQL, attribution.bound(INTERVALS_SQL, mine)).fetchnumpy()
    s, e, kind, nbytes = (np.asarray(r[k], dtype=np.int64) for k in ("s", "e", "kind", "bytes"))
    mig, faults, managed, kernels, plain = (kind == k for k in range(5))
    on_demand = _union(s[mig], e[mig])
    touched = mig | faults  # where the driver served faults: a managed memset over them waited for them
    stalled = managed & (cover.covered(s, e, s[touched], e[touched]) > 0)
    plain_ns = int((e[plain] - s[plain]).sum())
    bandwidth = float(nbytes[plain].sum()) / plain_ns if plain_ns else None
    outside = _union(s[mig | stalled], e[mig | stalled]) - on_demand
    work = int(nbytes[stalled].sum() / bandwidth) if bandwidth else outside
    gpu_faults = one_row(con.execute(GPU_FAULTS_SQL, attribution.bound(GPU_FAULTS_SQL, mine)))[0]
    return DeviceRow(
        device=device, on_demand_count=int(mig.sum()), on_demand_bytes=int(nbytes[mig].sum()), on_demand_ns=on_demand,
        exposed_ns=on_demand - int(cover.covered(*cover.islands(s[mig], e[mig]), s[kernels], e[kernels]).sum()),
        gpu_faults=int(gpu_faults) if faults_recorded else None, faulting_memsets=int(stalled.sum()),
        faulting_memset_ns=int((e[stalled] - s[stalled]).sum()), stalled_memset_ns=max(0, outside - work),
        memset_gb_per_s=None if bandwidth is None else round(bandwidth, 3), host_stall_ns=host_stall_ns)


def _rows(con: duckdb.DuckDBPyConnection, scope: Scope, prefetches: int) -> list[MigrationRow]:
    """The migrations by (device, direction, cause); unknown causes count as on demand without prefetch calls."""
    return [MigrationRow(device=d, direction=dr, cause=c, count=n, bytes=int(b), time_ns=int(t),
                         on_demand=c in ON_DEMAND or (c == "unknown" and not prefetches))
            for d, dr, c, n, b, t in con.execute(MIGRATIONS_SQL, scope_args(scope)).fetchall()]


def _host_stalls(con: duckdb.DuckDBPyConnection, scope: Scope, touched: set[int]) -> dict[int, int]:
    """Per device with migrations to the host on demand, its idle time between pages the host faulted in (the idle
    attribution's host_fault, computed once per model and window, as triage's idle findings read it)."""
    if not touched:
        return {}
    idle = attribution.attribute(con, scope).devices
    return {d: idle[d].ns("host_fault") for d in touched if d in idle}


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    args = {**scope_args(scope), "prefetch": PREFETCH_CALLS, "advise": ADVISE_CALLS, "managed": MANAGED_ALLOC_CALLS}
    prefetches, advice, allocs = one_row(con.execute(CALLS_SQL, args))
    rows = _rows(con, scope, prefetches)
    recorded = bool(one_row(con.execute("SELECT count(*) FROM capabilities WHERE data = 'uvm_faults' AND present"))[0])
    migrating = sorted({r.device for r in rows if r.on_demand})
    device_args = {**scope_args(scope), "causes": list(ON_DEMAND), "unknown": not prefetches}
    stalls = _host_stalls(con, scope, {r.device for r in rows if r.on_demand and r.direction == "UVM_D2H"})
    return Result(
        scope=scope, migration_count=sum(r.count for r in rows), migration_bytes=sum(r.bytes for r in rows),
        migration_time_ns=sum(r.time_ns for r in rows), on_demand_count=sum(r.count for r in rows if r.on_demand),
        rows=rows[:params.limit], truncated=len(rows) > params.limit, total_rows=len(rows),
        devices=[_device(con, device_args, d, recorded, stalls.get(d, 0)) for d in migrating],
        cpu_faults=one_row(con.execute(CPU_FAULTS_SQL, scope_args(scope)))[0] if recorded else None,
        prefetch_calls=prefetches, advise_calls=advice, managed_alloc_calls=allocs,
        capture_faults=None if recorded or not rows else remedy(con, ("uvm_faults",)))


def findings(result: Result) -> list[Finding]:
    """Per device: recurring on-demand migrations whose time (with the memsets they stall) is worth reporting."""
    window = result.scope.duration_ns
    return [_finding(d, result) for d in result.devices
            if d.on_demand_count >= MIN_ON_DEMAND and rules.worth_reporting(_stake(d), window)]


def _stake(d: DeviceRow) -> int:
    return d.on_demand_ns + d.stalled_memset_ns + d.host_stall_ns


def _tags(d: DeviceRow, result: Result) -> list[str]:
    """host-touch: the host's faults (with the idle between them) are most of it; both-ways: the kernels fault
    pages onto the device as well, MIN_ON_DEMAND times or more (a program that faults its inputs in and its
    results out needs the prefetch each way)."""
    mine = [r for r in result.rows if r.device == d.device and r.on_demand]
    to_host = sum(r.time_ns for r in mine if r.direction == "UVM_D2H")
    host_touch = 2 * (to_host + d.host_stall_ns) > d.on_demand_ns + d.host_stall_ns
    to_device = sum(r.count for r in mine if r.direction == "UVM_H2D")
    return ((["prefetching"] if result.prefetch_calls else [])
            + (["memset"] if d.stalled_memset_ns >= d.on_demand_ns else [])
            + (["host-touch"] if host_touch else [])
            + (["both-ways"] if host_touch and to_device >= MIN_ON_DEMAND else []))


def _finding(d: DeviceRow, result: Result) -> Finding:
    stake = _stake(d)
    memsets = (f"; {d.faulting_memsets} memsets on managed memory wait on them ({ms(d.faulting_memset_ns)})"
               if d.faulting_memsets else "")
    stall = (f"; the device idles {ms(d.host_stall_ns)} between them while the host faults pages in one at a time "
             "(reading managed memory that lives on the device)" if d.host_stall_ns else "")
    calls = (f"; the program prefetches ({result.prefetch_calls:,} prefetch call"
             f"{'s' if result.prefetch_calls > 1 else ''}) but these pages still fault"
             if result.prefetch_calls else "; no prefetch or advice calls in the window")
    evidence: dict[str, int | float | str] = {
        "on_demand_count": d.on_demand_count, "on_demand_bytes": d.on_demand_bytes, "on_demand_ns": d.on_demand_ns,
        "exposed_ns": d.exposed_ns, "faulting_memsets": d.faulting_memsets, "stalled_memset_ns": d.stalled_memset_ns,
        "host_stall_ns": d.host_stall_ns,
        "prefetch_calls": result.prefetch_calls, "advise_calls": result.advise_calls,
        **({"gpu_faults": d.gpu_faults} if d.gpu_faults is not None else {})}
    return Finding(
        root_cause="unified-memory-migration", severity=rules.severity(stake, result.scope.duration_ns),
        title=f"device {d.device}: {d.on_demand_count:,} unified-memory migrations on demand "
              f"({d.on_demand_bytes / 2**20:,.1f} MiB in {ms(d.on_demand_ns)}, "
              f"{pct(d.exposed_ns, d.on_demand_ns):.0f}% with no kernel running){stall}{memsets}{calls}",
        evidence=evidence, time_at_stake_ns=stake, device=d.device, tags=_tags(d, result))


def render(result: Result) -> str:
    moved = (f"{result.migration_count:,} unified-memory migrations, {result.migration_bytes / 2**20:,.1f} MiB, "
             f"{ms(result.migration_time_ns)} ({result.on_demand_count:,} on demand)" if result.migration_count
             else "no unified-memory migrations")
    lines = [f"{moved} on device(s) {result.scope.devices}; {result.prefetch_calls:,} prefetch and "
             f"{result.advise_calls:,} advice calls, {result.managed_alloc_calls:,} managed allocations"]
    lines.extend(f"{r.direction:>8} [dev {r.device}] {r.cause:<20} x{r.count:<7,} {r.bytes / 2**20:10,.1f} MiB "
                 f"{ms(r.time_ns):>12}{'  on demand' if r.on_demand else ''}" for r in result.rows)
    if result.truncated:
        lines.extend(more_rows(result, result.total_rows - len(result.rows), "rows"))
    lines.extend(f"device {d.device}: on demand {ms(d.on_demand_ns)}, {ms(d.exposed_ns)} with no kernel running; "
                 f"{d.faulting_memsets} memsets on managed memory over them ({ms(d.faulting_memset_ns)}), stalled "
                 f"{ms(d.stalled_memset_ns)}; idle while the host faults pages in {ms(d.host_stall_ns)}; GPU faults "
                 f"{'-' if d.gpu_faults is None else f'{d.gpu_faults:,}'}" for d in result.devices)
    if result.capture_faults:
        lines.append(f"page faults not recorded: {result.capture_faults}")
    elif result.cpu_faults is not None:
        lines.append(f"host page faults on managed memory: {result.cpu_faults:,}")
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
