"""How much of the GPU can a kernel's launches use? Read from what every export records per launch (grid and block
size, registers per thread, shared memory per block) and the device's limits (gpus: SM count, warps, blocks,
registers and shared memory per SM), never from a kernel's name.

Per (device, kernel) in the window (KernelFill), NCCL kernels left out (their few blocks are by design): its launches,
its configuration with the most time (main) and, when some launches have fewer blocks than the device has SMs, the
one of those with the most time (undersized), with idle_sm_ns and undersized_ns summed over all its configurations.
Per launch configuration (LaunchFill):
sms_used = min(blocks, sm_count), the SMs that get a block, as the block scheduler spreads blocks over idle SMs
first; blocks_per_sm = the theoretical occupancy limit, as the CUDA occupancy calculator takes it: the fewest
blocks the SM's warps, block slots, registers (allocated per warp in units of REGISTER_UNIT) and shared memory
(per block, plus SHARED_RESERVED_BYTES from compute capability 8.0) allow, each limit only where the export records
it; occupancy_pct = blocks_per_sm x warps per block / warps per SM; lanes_pct = threads per block / (warps per block
x the warp's width), the share of each warp's lanes that hold a thread. The width is the trace's (gpus.warp_size,
Kineto's warpSize), else 32 on NVIDIA and 64 on AMD before gfx10 (CDNA and GCN run 64-wide wavefronts; RDNA, gfx10
and later, runs 32-wide ones); on AMD a warp is called a wavefront. idle_sm_ns = for launches that give fewer
blocks than the device has SMs and run at least rules.TINY_KERNEL_NS, the time they run alone on the device (no
kernel of another stream beside them, which could use the other SMs) and with no unified-memory migration of the
device in flight that the driver made (FAULTED_SQL) x (1 - sms_used / sm_count): the SM time left idle, and the
most that spreading the same work over every SM could save (an upper bound: the kernel may be limited by something
else). While pages migrate on demand the kernel waits on them, not on its SMs: that time is unified_memory's
finding's, so the two never claim the same nanosecond; migrating_ns says how much of the launches' time was left
out so. Time alone never overlaps between kernels of one device, so their idle SM time never counts the same
nanosecond twice. A kernel a few microseconds long is bound by its latency, not by its SMs, so it counts none.
launches_before numbers a configuration's first launch among its process's launches of the kernel (short name) in
the capture, for Nsight Compute's --launch-skip (exact when the capture starts with the program).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import vendor
from stallhound.analysis.common import Scope, pct, scope_args
from stallhound.analysis.intervals import covered, overlaps
from stallhound.analysis.kernel_kinds import kind_of
from stallhound.analysis.rules import TINY_KERNEL_NS

WARP = 32  # threads per warp on every NVIDIA GPU (and an AMD RDNA wavefront)
AMD_WAVEFRONT = 64  # threads per wavefront on AMD GPUs before gfx10 (CDNA: MI100, MI200, MI300; GCN)
AMD_WAVE32_SINCE = 100  # RDNA (gfx10 and later) runs 32-wide wavefronts
REGISTER_UNIT = 256  # registers are given to a warp in units of 256 (occupancy calculator, compute capability 5+)
SHARED_RESERVED_BYTES = 1024  # shared memory the runtime reserves per block from compute capability 8.0
SHARED_RESERVED_SINCE = 80

OVERLAP_BUCKETS = 20_000  # time buckets over the window for the launch x concurrent-kernel join
# A unified-memory migration the driver made (every cause but the program's own prefetch: a fault, the speculation
# around one, an eviction), or of unknown cause whatever prefetch calls the program made: a superset of the migrations
# unified_memory counts as on demand, so that none of them is also counted as SM time here.
FAULTED_SQL = "(direction LIKE 'UVM%' AND coalesce(migration_cause, 'unknown') <> 'user_prefetch')"

# The window's kernels (NCCL left out) with their launch configuration and their device's limits; the launches that
# give fewer blocks than SMs for at least $tiny (small), each with the time no kernel of another stream of its device
# ran beside it and no migration the driver made was in flight (alone: the same stream's kernels never overlap it),
# and the time such a migration was; per configuration, the figures.
CONFIGS_SQL = """WITH
base AS NOT MATERIALIZED (
  SELECT k.device_id, k.stream_id, k.pid, k.start_ns, k.end_ns, k.duration_ns,
         coalesce(k.name, k.short_name, '(unnamed)') AS name, coalesce(k.short_name, k.name, '(unnamed)') AS short_name,
         k.grid_x::BIGINT * k.grid_y * k.grid_z AS blocks, k.block_x * k.block_y * k.block_z AS threads,
         coalesce(k.registers_per_thread, 0) AS registers,
         coalesce(k.static_shared_bytes, 0) + coalesce(k.dynamic_shared_bytes, 0) AS shared_bytes, g.sm_count,
         g.max_warps_per_sm AS max_warps, g.max_blocks_per_sm AS max_blocks, g.max_registers_per_sm AS max_registers,
         g.max_shared_per_sm_bytes AS max_shared, g.compute_capability AS capability, g.warp_size
  FROM kernels k LEFT JOIN gpus g USING (device_id)
  WHERE k.device_id IN (SELECT unnest($devices)) AND k.start_ns >= $start AND k.start_ns < $end
    AND k.category <> 'nccl' AND k.grid_x > 0 AND k.block_x > 0),
small AS MATERIALIZED (
  SELECT row_number() OVER () AS probe_id, * FROM base WHERE blocks < sm_count AND duration_ns >= $tiny),
probes AS (SELECT probe_id, device_id, start_ns, end_ns FROM small),
others AS (
  SELECT device_id, stream_id AS other_stream, false AS migration, start_ns, end_ns FROM kernels
  WHERE device_id IN (SELECT DISTINCT device_id FROM small) AND end_ns > start_ns
  UNION ALL SELECT device_id, NULL, true, start_ns, end_ns FROM memcpy
  WHERE device_id IN (SELECT DISTINCT device_id FROM small) AND end_ns > start_ns AND """ + FAULTED_SQL + """),
""" + overlaps("touch", "probes", "others", "device_id", "other_stream, migration") + """,
beside AS (
  SELECT t.probe_id, t.start_ns, t.end_ns FROM touch t JOIN small s USING (probe_id)
  WHERE t.migration OR t.other_stream IS DISTINCT FROM s.stream_id),
""" + covered("shared_time", "beside") + """,
migrating AS (SELECT probe_id, start_ns, end_ns FROM touch WHERE migration),
""" + covered("migrating_time", "migrating") + """,
alone AS (
  SELECT s.device_id, s.name, s.short_name, s.blocks, s.threads, s.registers, s.shared_bytes,
         sum(s.duration_ns - coalesce(c.ns, 0)) AS alone_ns, sum(coalesce(m.ns, 0)) AS migrating_ns
  FROM small s LEFT JOIN shared_time c USING (probe_id) LEFT JOIN migrating_time m USING (probe_id) GROUP BY ALL)
SELECT b.device_id, b.name, b.short_name, b.blocks, b.threads, b.registers, b.shared_bytes, count(*) AS count,
       sum(b.duration_ns) AS total_ns, coalesce(sum(b.duration_ns) FILTER (WHERE b.duration_ns >= $tiny), 0) AS long_ns,
       count(*) FILTER (WHERE b.duration_ns >= $tiny) AS long_count, coalesce(any_value(a.alone_ns), 0) AS alone_ns,
       coalesce(any_value(a.migrating_ns), 0) AS migrating_ns,
       min(b.start_ns) AS first_ns, arg_min(b.pid, b.start_ns) AS pid, any_value(b.sm_count) AS sm_count,
       any_value(b.max_warps) AS max_warps, any_value(b.max_blocks) AS max_blocks,
       any_value(b.max_registers) AS max_registers, any_value(b.max_shared) AS max_shared,
       any_value(b.capability) AS capability, any_value(b.warp_size) AS warp_size
FROM base b LEFT JOIN alone a USING (device_id, name, short_name, blocks, threads, registers, shared_bytes)
GROUP BY b.device_id, b.name, b.short_name, b.blocks, b.threads, b.registers, b.shared_bytes
ORDER BY total_ns DESC, b.device_id, b.name
"""


class LaunchFill(BaseModel):
    """One launch configuration of a kernel on a device."""
    blocks: int = Field(description="thread blocks per launch")
    threads_per_block: int
    registers_per_thread: int | None
    shared_bytes_per_block: int = Field(description="static + dynamic shared memory")
    count: int = Field(description="launches with this configuration in the window")
    total_ns: int
    sm_count: int | None = Field(description="the device's SMs; null when the export does not record them")
    sms_used: int | None = Field(description="SMs that get a block: min(blocks, sm_count)")
    blocks_per_sm: int | None = Field(description="theoretical limit of resident blocks per SM")
    limited_by: str | None = Field(description="the resource that sets blocks_per_sm")
    occupancy_pct: float | None = Field(description="theoretical occupancy: resident warps / warps per SM")
    lanes_pct: float = Field(description="share of each warp's lanes holding a thread")
    warp_size: int = Field(WARP, description="threads per warp (an AMD wavefront: 64 before RDNA)")
    warp_word: Literal["warp", "wavefront"] = Field("warp", description="what the GPU's vendor calls a warp")
    idle_sm_ns: int = Field(description="SM time its launches with fewer blocks than SMs (>= 10 us each) leave idle "
                                        "while they run alone on the device, no migration the driver made in flight")
    migrating_ns: int = Field(0, description="time of those launches with a migration the driver made in flight "
                                             "(the kernel waits on pages, not SMs: left out of idle_sm_ns)")
    first_ns: int = Field(description="start of its first launch in the window")
    pid: int | None = Field(description="process of that launch")
    launches_before: int | None = Field(None, description="its process's launches of the kernel before that one")


class KernelFill(BaseModel):
    """A kernel's launches on one device: the configuration with the most time, and the undersized one."""
    device: int
    name: str = Field(description="demangled name")
    short_name: str
    kind: str = Field(description="kernel_kinds.kind_of of the names")
    count: int
    total_ns: int
    idle_sm_ns: int = Field(description="SM time left idle by its launches with fewer blocks than SMs, summed")
    migrating_ns: int = Field(0, description="time of those launches with a migration the driver made in flight")
    undersized_ns: int = Field(description="time of those launches (>= 10 us each)")
    undersized_launches: int = Field(description="those launches")
    main: LaunchFill = Field(description="the configuration with the most time")
    undersized: LaunchFill | None = Field(description="of the configurations with fewer blocks than SMs, the one "
                                                      "with the most time")


def capability_number(text: str | None) -> int | None:
    """'9.0' -> 90."""
    found = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text or "")
    return int(found[1]) * 10 + int(found[2]) if found else None


def warp_width(recorded: int | None, capability: str | None, amd: bool) -> int:
    """Threads per warp: the trace's figure, else the vendor's (AMD before gfx10: 64-wide wavefronts)."""
    if recorded:
        return recorded
    gfx = capability_number(capability)
    return AMD_WAVEFRONT if amd and (gfx is None or gfx < AMD_WAVE32_SINCE) else WARP


def resident_blocks(threads: int, registers: int | None, shared: int, limits: dict) -> tuple[int | None, str | None]:
    """(blocks per SM, the limiting resource) by the occupancy calculator's rules, from the limits the export
    records (max_warps, max_blocks, max_registers, max_shared, capability) and the warp's width (warp, else 32);
    (None, None) when it records none."""
    width = limits.get("warp") or WARP
    warps = math.ceil(threads / width)
    capability = capability_number(limits.get("capability"))
    reserved = SHARED_RESERVED_BYTES if capability is not None and capability >= SHARED_RESERVED_SINCE else 0
    register_units = math.ceil((registers or 0) * width / REGISTER_UNIT) * REGISTER_UNIT
    bounds = {
        "warps": limits["max_warps"] // warps if limits.get("max_warps") else None,
        "block slots": limits.get("max_blocks") or None,
        "registers": limits["max_registers"] // register_units // warps
        if limits.get("max_registers") and register_units else None,
        "shared memory": limits["max_shared"] // (shared + reserved) if limits.get("max_shared") and shared else None,
    }
    known = {k: v for k, v in bounds.items() if v is not None}
    if not known:
        return None, None
    limiter = min(known, key=lambda k: (known[k], list(bounds).index(k)))
    return known[limiter], limiter


def _fill(row: dict, amd: bool) -> LaunchFill:
    blocks, threads, sms = int(row["blocks"]), int(row["threads"]), row["sm_count"]
    width = warp_width(row["warp_size"], row["capability"], amd)
    per_sm, limiter = resident_blocks(threads, row["registers"], int(row["shared_bytes"]), {**row, "warp": width})
    warps = math.ceil(threads / width)
    occupancy = (pct(per_sm * warps, row["max_warps"]) if per_sm is not None and row["max_warps"] else None)
    used = min(blocks, sms) if sms else None
    idle = round(row["alone_ns"] * (1 - used / sms)) if used is not None and sms and used < sms else 0
    return LaunchFill(blocks=blocks, threads_per_block=threads, registers_per_thread=row["registers"] or None,
                      shared_bytes_per_block=int(row["shared_bytes"]), count=row["count"],
                      total_ns=int(row["total_ns"]), sm_count=sms, sms_used=used, blocks_per_sm=per_sm,
                      limited_by=limiter, occupancy_pct=occupancy, lanes_pct=pct(threads, warps * width),
                      warp_size=width, warp_word="wavefront" if amd else "warp", idle_sm_ns=idle,
                      migrating_ns=int(row["migrating_ns"]), first_ns=row["first_ns"], pid=row["pid"])


def _kernel(key: tuple[int, str, str], configs: list[tuple[LaunchFill, int, int]]) -> KernelFill:
    """A kernel's configurations, each with its launches of at least TINY_KERNEL_NS (time, count), as one
    KernelFill."""
    small = [(f, long, n) for f, long, n in configs if f.idle_sm_ns]
    device, name, short = key
    return KernelFill(
        device=device, name=name, short_name=short, kind=kind_of(name, short),
        count=sum(c[0].count for c in configs), total_ns=sum(c[0].total_ns for c in configs),
        idle_sm_ns=sum(c[0].idle_sm_ns for c in small), migrating_ns=sum(c[0].migrating_ns for c in small),
        undersized_ns=sum(c[1] for c in small),
        undersized_launches=sum(c[2] for c in small), main=max(configs, key=lambda c: c[0].total_ns)[0],
        undersized=max(small, key=lambda c: c[1])[0] if small else None)


def fills(con: duckdb.DuckDBPyConnection, scope: Scope) -> list[KernelFill]:
    """Every (device, kernel) of the window, most time first."""
    amd = vendor.of(con) == vendor.AMD  # asked first: a query on `con` drops the pending rows of `cur`
    cur = con.execute(CONFIGS_SQL, {**scope_args(scope), "tiny": TINY_KERNEL_NS,
                                    "bucket_ns": max(1000, scope.duration_ns // OVERLAP_BUCKETS)})
    names = [d[0] for d in cur.description]
    grouped: dict[tuple[int, str, str], list[tuple[LaunchFill, int, int]]] = defaultdict(list)
    for r in cur.fetchall():
        row = dict(zip(names, r, strict=True))
        grouped[(row["device_id"], row["name"], row["short_name"])].append(
            (_fill(row, amd), int(row["long_ns"]), row["long_count"]))
    return sorted((_kernel(key, configs) for key, configs in grouped.items()), key=lambda k: -k.total_ns)


BEFORE_SQL = """
WITH f AS (SELECT unnest($ids) AS i, unnest($pids) AS pid, unnest($names) AS short_name, unnest($starts) AS first_ns)
SELECT f.i, count(k.start_ns) FROM f
LEFT JOIN kernels k ON k.pid = f.pid AND coalesce(k.short_name, k.name, '(unnamed)') = f.short_name
  AND k.start_ns < f.first_ns
GROUP BY f.i
"""


def numbered(con: duckdb.DuckDBPyConnection, kernels: list[KernelFill]) -> list[KernelFill]:
    """The kernels with launches_before set on their main and undersized configurations."""
    parts = [(i, part) for i, k in enumerate(kernels) for part in ("main", "undersized") if getattr(k, part)]
    configs = [getattr(kernels[i], part) for i, part in parts]
    found = dict(con.execute(BEFORE_SQL, {
        "ids": list(range(len(parts))), "pids": [f.pid for f in configs],
        "names": [kernels[i].short_name for i, _ in parts], "starts": [f.first_ns for f in configs]}).fetchall()
    ) if parts else {}
    updates: dict[int, dict[str, LaunchFill]] = defaultdict(dict)
    for n, ((i, part), f) in enumerate(zip(parts, configs, strict=True)):
        updates[i][part] = f.model_copy(update={"launches_before": found.get(n)})
    return [k.model_copy(update=updates[i]) for i, k in enumerate(kernels)]
