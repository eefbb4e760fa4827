"""Analysis skills: one module per skill, each exposed as one MCP tool."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

TOOL_NAMES = (
    "profile_summary",
    "gpu_utilization",
    "top_kernels",
    "gpu_idle_gaps",
    "kernel_launch_overhead",
    "memory_transfers",
    "sync_analysis",
    "nccl_breakdown",
    "thread_utilization",
    "nvtx_breakdown",
    "iterations",
    "find_kernels",
    "describe_schema",
    "query_sql",
    "triage",
    "answer_questions",
    "show_timeline",
)

PAIR_TOOL_NAMES = ("diff_profiles", "verify_fix")  # tools comparing two profiles, `before` and `after`

JOB_TOOL_NAMES = ("rank_imbalance", "triage_job")  # tools reading every rank of a job (Params.job; a job connection)


def skills() -> dict[str, ModuleType]:
    """name -> module for every skill (each has Params, Result, run, render)."""
    return {name: import_module(f"stallhound.tools.{name}") for name in TOOL_NAMES}


def pair_tools() -> dict[str, ModuleType]:
    """name -> module for every tool comparing two profiles (each has Params, Result, compare, render)."""
    return {name: import_module(f"stallhound.tools.{name}") for name in PAIR_TOOL_NAMES}


def job_tools() -> dict[str, ModuleType]:
    """name -> module for every tool reading a job's ranks (each has Params, Result, run, render)."""
    return {name: import_module(f"stallhound.tools.{name}") for name in JOB_TOOL_NAMES}
