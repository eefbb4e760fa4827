"""Veteran question 2: how many GPUs take part, and how is the work split across them?

The GPUs and processes traced (profile_summary), the job they belong to where the profile records it (its rank,
world size, backend and process groups: torch.profiler's distributedInfo), and the communication in triage's window
(nccl_breakdown's context, analysis/comm_context.py): each collective pattern and kernel family seen, most
time first, with the parallelism it points to (by the library where only one parallelism uses it, BY_FAMILY; by a
framework whose ranges the trace holds, BY_FRAMEWORK; else by the pattern alone, BY_PATTERN), and the frameworks
seen. A profile of one rank of a larger job says so, never "single GPU".
"""

from __future__ import annotations

from typing import Any

from stallhound.analysis import comm_context as cc
from stallhound.formats.comm_kernels import CUSTOM_ALL_REDUCE, EXPERT_PARALLEL
from stallhound.tools import nccl_breakdown
from stallhound.tools.answers.evidence import Evidence
from stallhound.tools.profile_summary import Distributed

# What each collective pattern, or a library that serves one parallelism only, points to.
BY_PATTERN = {
    cc.ALL_REDUCE: "data parallel (DDP) or tensor parallel",
    cc.SHARDED: "sharded data parallel (FSDP/ZeRO) or tensor/sequence parallel",
    cc.ALL_TO_ALL: "expert, embedding (TorchRec) or sequence parallel",
    cc.POINT_TO_POINT: "pipeline parallel",
    cc.SEND_RECV: "pipeline parallel or an all-to-all (NCCL runs both as SendRecv kernels)",
    cc.BROADCAST: "broadcasts (of parameters at start, or of a root rank's data)",
    cc.OTHER: "collectives the trace does not name",
}
BY_FAMILY = {EXPERT_PARALLEL.name: "expert parallel (DeepEP-style dispatch/combine)",
             CUSTOM_ALL_REDUCE.name: "tensor parallel (custom all-reduce kernels)"}
# A pattern together with a framework whose ranges the trace holds (comm_context.FRAMEWORKS), first that holds.
BY_FRAMEWORK: tuple[tuple[str, str, str], ...] = (
    (cc.ALL_REDUCE, "DDP", "data parallel (DDP, whose ranges are in the trace)"),
    (cc.SHARDED, "FSDP", "sharded data parallel (FSDP, whose ranges are in the trace)"),
    (cc.SHARDED, "DeepSpeed", "sharded data parallel (DeepSpeed ZeRO)"),
    (cc.ALL_TO_ALL, "MoE", "expert parallel (MoE layers' ranges are in the trace)"),
    (cc.ALL_TO_ALL, "TorchRec", "embedding-table parallel (TorchRec's ranges are in the trace)"),
)
SHOWN_PATTERNS = 3  # the patterns with the most time


def _job(devices: int, job: Distributed | None) -> str:
    traced = f"{devices} GPU(s) traced"
    if job is None or job.world_size is None:
        return traced
    backend = f", backend {job.backend}" if job.backend else ""
    groups = sorted(set(job.process_group_sizes), reverse=True)
    sizes = f"; process groups of {', '.join(map(str, groups))} ranks" if groups else ""
    return (f"{traced} of a job of {job.world_size} rank(s) (rank {job.rank}, from {job.source}{backend}{sizes})")


def _hint(p: cc.PatternTime, frameworks: list[str]) -> str:
    seen = next((hint for pattern, name, hint in BY_FRAMEWORK if p.pattern == pattern and name in frameworks), None)
    return BY_FAMILY.get(p.family) or seen or BY_PATTERN[p.pattern]


def _communication(ctx: cc.Context | None, world: int | None) -> str:
    if ctx is None or not ctx.patterns:
        if world and world > 1:
            return "no collective kernels in the analysed window: the job's communication falls outside it"
        return "no collectives: single-GPU work, or communication outside this capture"
    total = sum(p.ns for p in ctx.patterns) or 1
    shown = [f"{p.pattern} by {p.family} kernels ({100 * p.ns / total:.0f}%): {_hint(p, ctx.frameworks)}"
             for p in ctx.patterns[:SHOWN_PATTERNS]]
    frameworks = f"; frameworks seen: {', '.join(ctx.frameworks)}" if ctx.frameworks else ""
    return "communication: " + "; ".join(shown) + frameworks


def answer(e: Evidence) -> tuple[str, dict[str, Any]] | None:
    summary = e.summary
    if not summary.devices:
        return None
    nccl = e.tool("nccl_breakdown", nccl_breakdown.Result)  # triage's run, on its window
    ctx = nccl.context if nccl else None
    job = summary.distributed
    world = job.world_size if job else None
    kinds = sorted({r.collective for r in nccl.rows}) if nccl else []
    processes = summary.launching_process_count
    text = (f"{_job(len(summary.devices), job)}, {processes} process(es) launching kernels; "
            f"{_communication(ctx, world)}")
    return text, {"collectives": kinds, "gpu_processes": processes, "devices_traced": len(summary.devices),
                  "world_size": world, "patterns": [p.pattern for p in ctx.patterns] if ctx else [],
                  "families": [f.family for f in nccl.families] if nccl else [],
                  "frameworks": ctx.frameworks if ctx else []}
