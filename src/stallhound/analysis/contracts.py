"""What a skill module is: the contracts the server's wiring (server/app.py, server/job_tools.py) relies on, and
run_skill, the one place a skill's findings join its figures.

A module is checked against these with isinstance (they are runtime-checkable), which sees that the names
exist; tests/test_contracts.py checks every registered module so, and the signatures besides.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

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
    """A skill whose findings follow from its Result alone: its run() computes the figures, run_skill attaches
    findings(result) as Result.findings; triage ranks them with the rest."""

    def findings(self, result: Output) -> list[Finding]: ...


def run_skill(con: duckdb.DuckDBPyConnection, module: ModuleType, params: BaseModel) -> Output:
    """module.run(con, params) with the findings of a Detector attached: every caller that shows or ranks a
    skill's result (the server, the CLI, triage and the tools that reuse results, the report) goes through here."""
    result = module.run(con, params)
    if isinstance(module, Detector):
        result.findings = module.findings(result)
    return result
