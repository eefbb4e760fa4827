"""The MCP tools: one module per tool at the top of this package, each named in one registry below (helpers that
serve several tools live in subpackages: diff/, answers/). detectors() hands triage every detector's TriageRole."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from stallhound.analysis.contracts import SOLE, TriageHow, TriageRole
from stallhound.model.errors import UnknownTool

TOOL_NAMES = (
    "profile_summary",
    "gpu_utilization",
    "top_kernels",
    "gpu_idle_gaps",
    "kernel_launch_overhead",
    "memory_transfers",
    "unified_memory",
    "sync_analysis",
    "nccl_breakdown",
    "thread_utilization",
    "nvtx_breakdown",
    "iterations",
    "find_kernels",
    "call_sites",
    "describe_schema",
    "query_sql",
    "triage",
    "answer_questions",
    "show_timeline",
)

PAIR_TOOL_NAMES = ("diff_profiles", "verify_fix")  # tools comparing two profiles, `before` and `after`

JOB_TOOL_NAMES = ("rank_imbalance", "triage_job")  # tools reading every rank of a job (Params.job; a job connection)

# The tools with findings (detectors), named here so that a triage imports only them, not every tool (that cost each
# start ~50 ms); tests/test_contracts.py checks that they are exactly the registered tools with findings.
DETECTOR_NAMES = ("top_kernels", "gpu_idle_gaps", "kernel_launch_overhead", "memory_transfers", "unified_memory",
                  "sync_analysis", "nccl_breakdown", "thread_utilization", "iterations", "rank_imbalance")


def skill(name: str) -> ModuleType:
    """The module of the single-profile tool `name`, imported alone (a command runs one tool: importing them all
    would cost every start)."""
    if name not in TOOL_NAMES:
        raise UnknownTool(f"there is no tool {name!r} (tools: {', '.join(TOOL_NAMES)})")
    return import_module(f"stallhound.tools.{name}")


def skills() -> dict[str, ModuleType]:
    """name -> module for every skill (each has Params, Result, run, render)."""
    return {name: skill(name) for name in TOOL_NAMES}


def pair_tools() -> dict[str, ModuleType]:
    """name -> module for every tool comparing two profiles (each has Params, Result, compare, render)."""
    return {name: import_module(f"stallhound.tools.{name}") for name in PAIR_TOOL_NAMES}


def job_tools() -> dict[str, ModuleType]:
    """name -> module for every tool reading a job's ranks (each has Params, Result, run, render)."""
    return {name: import_module(f"stallhound.tools.{name}") for name in JOB_TOOL_NAMES}


def detectors(*how: TriageHow) -> list[tuple[str, ModuleType, TriageRole]]:
    """(name, module, TRIAGE) of every detector (DETECTOR_NAMES), those with a role in `how` (all when none is
    named), in triage's order (by TriageRole.order; the others after, by name). A tool with findings but no TRIAGE,
    or a TRIAGE but no findings, is refused: triage would silently leave it out; so is a second tool declaring a
    SOLE role: triage would count the same findings twice."""
    found = []
    for name in sorted(DETECTOR_NAMES):
        module = import_module(f"stallhound.tools.{name}")
        role = getattr(module, "TRIAGE", None)
        if hasattr(module, "findings") != isinstance(role, TriageRole):
            raise TypeError(f"tool {name}: a detector (findings(result)) declares TRIAGE = TriageRole(...), and "
                            "only a detector does")
        if role is not None:
            found.append((name, module, role))
    for sole in SOLE:
        declaring = [name for name, _, role in found if role.how == sole]
        if len(declaring) > 1:
            raise TypeError(f"tools {', '.join(declaring)} all declare TriageRole({sole!r}): one tool at most has "
                            "that role")
    return sorted((d for d in found if not how or d[2].how in how),
                  key=lambda d: (d[2].order is None, d[2].order or 0))


def declared(how: TriageHow) -> ModuleType:
    """The one tool declaring the SOLE role `how` (the warmup detector chooses triage's window)."""
    found = detectors(how)
    if len(found) != 1:
        raise TypeError(f"no tool declares TriageRole({how!r}), which triage needs")
    return found[0][1]
