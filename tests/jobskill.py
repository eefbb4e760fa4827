"""A minimal job tool for the wiring tests (the real ones are in JOB_TOOL_NAMES): kernels per rank."""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import Output


class Params(BaseModel):
    job: str = Field(description="job id from load_job")
    min_rank: int = Field(0, ge=0, description="first rank to count")


class Result(Output):
    kernels_per_rank: dict[int, int]


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    rows = con.execute("SELECT rank, count(*) FROM kernels WHERE rank >= ? GROUP BY rank", [params.min_rank])
    return Result(kernels_per_rank=dict(rows.fetchall()))


def render(result: Result) -> str:
    return "\n".join(f"rank {r}: {n} kernels" for r, n in sorted(result.kernels_per_rank.items()))
