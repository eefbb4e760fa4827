"""Is the run compute-, transfer-, communication- or host-bound? Device-time shares from interval unions.

Per device over the window: busy = union of all its kernels, copies, memsets and CUDA graph executions (the
complement of its idle time, analysis/attribution.py);
compute = union of its non-communication kernels and graph executions (graphs recorded whole hide their kernels;
copy-like kernels included, copy_kernel_pct shows their own union); communication = union of its communication
kernels (kernels.category 'nccl': NCCL's and those of the other libraries of formats/comm_kernels.py, named in
communication_families); transfer = union of its memcpy and memset. Each share is the sum over devices of that
union / (window x devices), so each lies in 0-100; idle_pct = 100 - busy_pct; overlap_pct = compute +
transfer + communication - busy (time in which two kinds of work ran at once). One function serves triage and
answer_questions, so both always agree.
"""

from __future__ import annotations

from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import attribution, device_pass, untraced_kernels
from stallhound.analysis.common import Scope, pct, scope_args

IDLE_DOMINATED_PCT = 40.0  # idle above this share of the window outweighs any kernel-level tuning
MIN_GPU_OPS = 10  # fewer kernels, copies and memsets than this say nothing about a workload, unless they add up to
FEW_OPS_MIN_BUSY_NS = 10_000_000  # 10 ms of GPU work or more: then they are the workload (one long kernel, a few GEMMs)
MIN_BUSY_NS = 1_000_000  # less than 1 ms of GPU work says nothing either
HOST_CAUSES = {"cpu-bottleneck", "small-kernel-overhead", "excessive-synchronization", "blocking-d2h-sync",
               "alloc-in-loop", "module-loading-hot-path", "torch-compile-recompilation", "gc-pauses",
               "dataloader-starvation", "host-communication", "pageable-host-memory", "unified-memory-migration"}
UNRECORDED_REASON = ("GPU work was launched and the trace shows the GPU at work (the note above) but holds none of "
                     "its records: the device's time is not recorded, so its compute, transfer, communication and "
                     "idle shares are unknown")
Bound = Literal["compute-bound", "transfer-bound", "communication-bound", "host-bound", "idle-dominated",
                "too little GPU activity", "no GPU activity"]


class FamilyTime(BaseModel):
    family: str = Field(description="kernels.comm_family")
    count: int
    ns: int = Field(description="summed kernel time clipped to the window (concurrent kernels count twice)")


class Classification(BaseModel):
    bound: Bound
    compute_pct: float = Field(description="union of non-NCCL kernels / (window x devices)")
    copy_kernel_pct: float = Field(description="union of copy-like kernels (casts, copies): part of compute_pct")
    transfer_pct: float = Field(description="union of memcpy and memset / (window x devices)")
    communication_pct: float = Field(description="union of communication kernels / (window x devices)")
    communication_families: list[str] = Field(default_factory=list, description=(
        "libraries of the communication kernels in the window (kernels.comm_family: NCCL, expert-parallel, custom "
        "all-reduce, ...), most time first"))
    busy_pct: float
    idle_pct: float
    overlap_pct: float = Field(description="time counted in more than one of the three shares")
    gpu_ops: int = Field(description="kernels, copies and memsets in the window")
    reason: str
    shares_basis: Literal["measured", "not recorded"] = Field("measured", description=(
        "'not recorded' when the trace shows the GPU worked but holds none of its activity "
        "(untraced_kernels.ran_unrecorded): the shares are then unknown, not measured, and left at 0"))


FAMILIES_SQL = """
SELECT coalesce(comm_family, 'NCCL'), count(*), sum(least(end_ns, $end) - greatest(start_ns, $start))::BIGINT
FROM kernels WHERE category = 'nccl' AND device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end
GROUP BY 1 ORDER BY 3 DESC, 1"""
SLICES = attribution.DEVICE_PASS_SLICES  # computed with the idle attribution shares reads anyway


def _unions(con: duckdb.DuckDBPyConnection, scope: Scope) -> tuple[dict[str, int], int]:
    """Each kind's union summed over the devices (analysis/device_pass.py, computed once per model and scope), and the
    operations."""
    passes = device_pass.device_passes(con, scope, SLICES).values()
    return {kind: sum(p.kinds[kind] for p in passes) for kind in device_pass.KINDS}, sum(p.ops for p in passes)


def families(con: duckdb.DuckDBPyConnection, args: dict[str, object]) -> list[FamilyTime]:
    """The libraries of the communication kernels in scope (`args`: scope_args), most time first."""
    return [FamilyTime(family=f, count=n, ns=ns) for f, n, ns in con.execute(FAMILIES_SQL, args).fetchall()]


def classify(con: duckdb.DuckDBPyConnection, scope: Scope, fired: set[str]) -> Classification:
    """`fired`: root causes of the findings raised on the same window (they name a host-bound run)."""
    devices = attribution.attribute(con, scope).devices  # first: its gap pass computes the unions in passing
    ns, ops = _unions(con, scope)
    if not ops and untraced_kernels.ran_unrecorded(con):
        return Classification(bound="no GPU activity", compute_pct=0, copy_kernel_pct=0, transfer_pct=0,
                              communication_pct=0, busy_pct=0, idle_pct=0, overlap_pct=0, gpu_ops=0,
                              reason=UNRECORDED_REASON, shares_basis="not recorded")
    ns["busy"] = sum(d.window_ns - d.idle_ns for d in devices.values())
    capacity = scope.duration_ns * len(scope.devices)
    share = {cat: pct(ns.get(cat, 0), capacity) for cat in ("compute", "copy_kernel", "transfer", "communication",
                                                             "busy")}
    overlap = round(max(0.0, share["compute"] + share["transfer"] + share["communication"] - share["busy"]), 2)
    idle = round(100 - share["busy"], 2)
    bound, reason = _bound(share, idle, ops, ns.get("busy", 0), fired)
    found = [f.family for f in families(con, scope_args(scope))]
    return Classification(bound=bound, compute_pct=share["compute"], copy_kernel_pct=share["copy_kernel"],
                          transfer_pct=share["transfer"], communication_pct=share["communication"],
                          communication_families=found,
                          busy_pct=share["busy"], idle_pct=idle, overlap_pct=overlap, gpu_ops=ops, reason=reason)


def shares_line(c: Classification) -> str:
    """The shares as triage prints them, or why they are unknown."""
    if c.shares_basis == "not recorded":
        return "  shares unknown: the device's time is not recorded (compute, transfer, communication, idle)"
    return (f"  compute {c.compute_pct:.1f}%  transfer {c.transfer_pct:.1f}%  communication {c.communication_pct:.1f}%"
            f"{families_note(c)}  idle {c.idle_pct:.1f}%  (overlap {c.overlap_pct:.1f}%)")


def families_note(c: Classification) -> str:
    """' (expert-parallel, NCCL)' after the communication share when it holds more than NCCL, else ''."""
    return f" ({', '.join(c.communication_families)})" if set(c.communication_families) - {"NCCL"} else ""


def _bound(share: dict[str, float], idle: float, ops: int, busy_ns: int, fired: set[str]) -> tuple[Bound, str]:
    if not ops:
        return "no GPU activity", "no kernel, copy or memset in the window"
    if busy_ns < MIN_BUSY_NS or (ops < MIN_GPU_OPS and busy_ns < FEW_OPS_MIN_BUSY_NS):
        return "too little GPU activity", (f"only {ops} GPU operations ({busy_ns / 1e6:.3f} ms of GPU work) in the "
                                           "window: too little to classify")
    if idle >= IDLE_DOMINATED_PCT:
        host = sorted(fired & HOST_CAUSES)
        if host:
            return "host-bound", f"devices idle {idle:.1f}% of the window while the host shows {', '.join(host)}"
        return "idle-dominated", f"devices idle {idle:.1f}% of the window; the trace shows no host cause"
    kinds: dict[Bound, float] = {"compute-bound": share["compute"], "transfer-bound": share["transfer"],
                                 "communication-bound": share["communication"]}
    bound = max(kinds, key=kinds.__getitem__)
    return bound, f"largest share: {bound.removesuffix('-bound')} at {kinds[bound]:.1f}% (idle {idle:.1f}%)"
