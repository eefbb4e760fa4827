"""What a skill module is: the contracts the server's wiring (server/wrapper.py) relies on,
run_skill, the one place a skill's findings join its figures, and TriageRole, how a detector declares what triage
does with its findings.

A module is checked against these with isinstance (they are runtime-checkable), which sees that the names
exist; tests/test_contracts.py checks every registered module so, and the signatures besides.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import duckdb
from pydantic import BaseModel

if TYPE_CHECKING:  # analysis/common.py runs skills through run_skill, so it cannot be imported from here at run time
    from stallhound.analysis.common import Finding, Output


@runtime_checkable
class Skill(Protocol):
    """One MCP tool on one profile (tools.TOOL_NAMES): strict Params in, a Result the budget can cut out."""
    Params: type[BaseModel]
    Result: type[Output]

    def run(self, con: duckdb.DuckDBPyConnection, params: BaseModel) -> Output: ...

    def render(self, result: Output) -> str: ...


@runtime_checkable
class PairSkill(Protocol):
    """One MCP tool on two profiles (tools.PAIR_TOOL_NAMES): each side measured on its own, then compared."""
    Params: type[BaseModel]
    Result: type[Output]

    def run(self, before: duckdb.DuckDBPyConnection, after: duckdb.DuckDBPyConnection, params: BaseModel) -> Output:
        ...

    def compare(self, before: BaseModel, after: BaseModel, params: BaseModel) -> Output: ...

    def render(self, result: Output) -> str: ...


@runtime_checkable
class JobSkill(Skill, Protocol):
    """One MCP tool on every rank of a job (tools.JOB_TOOL_NAMES): a Skill whose `con` is the job's connection."""


@runtime_checkable
class Detector(Protocol):
    """A skill whose findings follow from its Result alone: its run() computes the figures (with, where the findings
    need more than the result shows, those figures in a private attribute of the Result), run_skill attaches
    findings(result) as Result.findings. Every detector declares a TriageRole as its module's TRIAGE."""

    def findings(self, result: Output) -> list[Finding]: ...


TriageHow = Literal["warmup", "idle", "window", "part", "job"]
# the roles whose findings triage gathers itself, each at its `order`
TRIAGED: tuple[TriageHow, ...] = ("warmup", "idle", "window")
SOLE: tuple[TriageHow, ...] = ("warmup", "idle")  # the roles one detector at most declares: a second would hand
# triage the same window or the same idle findings twice


@dataclass(frozen=True)
class TriageRole:
    """What triage does with a detector's findings; each detector module declares one as TRIAGE, and the tool
    registry (tools.detectors) hands them to triage, so a detector without one is refused, never ignored.
    how:
      warmup: its run on the whole capture chooses triage's window (iterations: steady_window, step_named); its
              findings, about the warmup that window leaves out, count when the window is the steady state;
      idle:   the idle-cause findings of triage's window (analysis/idle_causes.py), the ones this tool lists: triage
              takes them from its window_findings(con, scope, device, in_loop);
      window: triage runs the tool on its window and devices and ranks its findings;
      part:   the tool lists a part of the findings of detector `of`: triage takes them there, never twice;
      job:    the tool reads every rank of a job: triage_job ranks its findings with the triaged rank's.
    One detector at most declares each of the SOLE roles (tools.detectors refuses a second).
    order: for warmup, idle and window, the place of its findings among triage's (findings of equal cost, and the
    detectors skipped, keep it)."""
    how: TriageHow
    order: int | None = None
    of: str | None = None

    def __post_init__(self) -> None:
        if (self.how in TRIAGED) != (self.order is not None) or (self.how == "part") != (self.of is not None):
            raise ValueError(f"TriageRole({self.how!r}): `order` goes with {', '.join(TRIAGED)}, `of` with 'part'")


def run_skill(con: duckdb.DuckDBPyConnection, module: ModuleType, params: BaseModel) -> Output:
    """module.run(con, params) with the findings of a Detector attached: every caller that shows or ranks a
    skill's result (the server, the CLI, triage and the tools that reuse results, the report) goes through here."""
    result = module.run(con, params)
    if isinstance(module, Detector):
        result.findings = module.findings(result)
    return result
