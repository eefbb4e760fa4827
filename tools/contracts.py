"""What a skill module is: the contracts the server's wiring (server/app.py, server/job_tools.py) relies on.

A module is checked against these with isinstance (they are runtime-checkable), which sees that the names
exist; tests/test_contracts.py checks every registered module so, and the signatures besides.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import duckdb
from pydantic import BaseModel

from nsightful.tools.common import Finding, Output


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
    """A skill whose findings follow from its Result alone (Result.findings); triage ranks them with the rest."""

    def findings(self, result: Output) -> list[Finding]: ...
