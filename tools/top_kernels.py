"""Which kernels take the most GPU time?

Kernels are grouped by name (short or demangled) across the chosen devices, counting each
kernel whose start lies in the window. total_ns sums their durations (overlapping kernels
count in full); kernel_time_pct = total_ns / all kernel time in scope; window_pct =
total_ns / (window length x number of devices in scope). Durations in ns.
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.tools.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Scope,
    ScopedParams,
    fetch_capped,
    ms,
    pct,
    resolve_scope,
    scope_args,
)

HOTSPOT_PCT = 30.0  # one kernel above this share of GPU time is worth optimising on its own
# NCCL kernels are excluded: their time includes waiting for peers (see nccl_breakdown).


class Params(ScopedParams):
    name_by: Annotated[Literal["short", "demangled"], Field(
        description="Group by the short name (e.g. gemm_kernel) or the full demangled signature")] = "short"
    per_device: Annotated[bool, Field(description="One row per (kernel, device) instead of per kernel")] = False
    limit: LimitParam = DEFAULT_LIMIT


class KernelRow(BaseModel):
    name: str
    device: int | None = Field(description="device, when per_device; else null (all devices in scope)")
    category: str
    count: int
    total_ns: int
    mean_ns: float
    median_ns: float
    min_ns: int
    max_ns: int
    std_ns: float
    kernel_time_pct: float
    window_pct: float


class Result(BaseModel):
    scope: Scope
    kernel_count: int = Field(description="kernels in scope")
    kernel_time_ns: int = Field(description="sum of their durations")
    distinct_names: int
    rows: list[KernelRow]
    truncated: bool
    total_rows: int = Field(description="rows before the limit")
    findings: list[Finding] = []


SQL = """
WITH k AS (
  SELECT CASE WHEN $by = 'short' THEN short_name ELSE name END AS kname, device_id, category, duration_ns
  FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end),
g AS (
  SELECT kname, CASE WHEN $per_device THEN device_id END AS device, any_value(category) AS category,
         count(*) AS n, sum(duration_ns) AS total, avg(duration_ns) AS mean, median(duration_ns) AS med,
         min(duration_ns) AS lo, max(duration_ns) AS hi, coalesce(stddev_pop(duration_ns), 0) AS sd
  FROM k GROUP BY ALL)
SELECT *, count(*) OVER () AS total_rows FROM g ORDER BY total DESC, kname LIMIT $limit
"""

TOTALS_SQL = """
SELECT count(*), coalesce(sum(duration_ns), 0), count(DISTINCT CASE WHEN $by = 'short' THEN short_name ELSE name END)
FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end
"""


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    args = {**scope_args(scope), "by": params.name_by}
    count, total, distinct = con.execute(TOTALS_SQL, args).fetchone()
    rows, truncated = fetch_capped(con, SQL, {**args, "per_device": params.per_device}, params.limit)
    capacity = scope.duration_ns * max(len(scope.devices), 1)
    out = [KernelRow(name=r[0] or "(unnamed)", device=r[1], category=r[2], count=r[3], total_ns=int(r[4]),
                     mean_ns=round(r[5], 1), median_ns=float(r[6]), min_ns=r[7], max_ns=r[8], std_ns=round(r[9], 1),
                     kernel_time_pct=pct(r[4], total), window_pct=pct(r[4], capacity)) for r in rows]
    result = Result(scope=scope, kernel_count=count, kernel_time_ns=int(total), distinct_names=distinct, rows=out,
                    truncated=truncated, total_rows=rows[0][10] if rows else 0)
    result.findings = findings(result)
    return result


def findings(result: Result) -> list[Finding]:
    return [Finding(root_cause="kernel-hotspot", severity="medium" if row.kernel_time_pct < 50 else "high",
                    title=f"{row.name} takes {row.kernel_time_pct:.1f}% of kernel time",
                    evidence={"kernel_time_pct": row.kernel_time_pct, "total_ns": row.total_ns, "count": row.count},
                    time_at_stake_ns=row.total_ns // 2, device=row.device)
            for row in result.rows
            if row.kernel_time_pct > HOTSPOT_PCT and result.kernel_count > 1 and row.category != "nccl"]


def render(result: Result) -> str:
    lines = [f"{result.kernel_count:,} kernels, {ms(result.kernel_time_ns)} kernel time, "
             f"{result.distinct_names:,} names on device(s) {result.scope.devices}"]
    for r in result.rows:
        where = f" [dev {r.device}]" if r.device is not None else ""
        lines.append(f"{r.kernel_time_pct:6.2f}%  {ms(r.total_ns):>14}  x{r.count:<7,} mean {ms(r.mean_ns)}  "
                     f"{r.name[:90]}{where}")
    if result.truncated:
        lines.append(f"... {result.total_rows - len(result.rows)} more names: raise `limit` to see them")
    return "\n".join(lines)
