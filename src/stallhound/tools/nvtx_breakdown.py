"""Where does the time go by NVTX range, on the CPU and on the GPU work launched inside each range?

NVTX push/pop and start/end ranges that start in the window (default: whole capture), grouped by (text,
depth) or by text; with merge_numbers, runs of digits in the text become '#' so 'iteration 3' and
'iteration 4' group. cpu_ns = sum of range durations (nested ranges count in their parents too). A
kernel of a device in scope belongs to every range of its launching thread (same pid/tid) that contains
its launch call's start: kernel_count, gpu_ns = sum of their durations, gpu_span_ns = sum over ranges of
first kernel start to last kernel end. Phases: the shallowest push/pop depth where names matching two or
more of dataload / forward / backward / optimizer (name regexes; the rest 'other') hold half the CPU time;
per phase count, cpu_ns, gpu_ns and cpu_pct = share of the cpu time at that depth. No findings: CPU time in
a range costs nothing unless the GPU waits; the GPU idle time inside data-loading ranges is
dataloader-starvation in gpu_idle_gaps. Times in ns.
"""

from __future__ import annotations

import re
from typing import Annotated

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import (
    DEFAULT_LIMIT,
    LimitParam,
    Output,
    Scope,
    ScopedParams,
    more_rows,
    ms,
    pct,
    resolve_scope,
)
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row
from stallhound.model.sql_files import sql_beside

PHASES = (  # checked in this order: "optimizer.zero_grad" is optimizer work, not backward
    ("optimizer", re.compile(r"optim|step|adam|sgd", re.I)),
    ("backward", re.compile(r"backward|bwd|grad", re.I)),
    ("forward", re.compile(r"forward|fwd", re.I)),
    ("dataload", re.compile(r"data|load|batch", re.I)),
)
PHASE_ORDER = ("dataload", "forward", "backward", "optimizer", "other")
PHASE_COVER_PCT = 50.0  # named phases must hold half the CPU time of a depth: a stray "load" name is no split
FINE_BUCKET_NS = 50_000  # launch/range join buckets: most framework op ranges are shorter than 50 us,
COARSE_BUCKET_NS = 5_000_000  # most step/phase ranges shorter than 5 ms; few candidates per bucket either way


class Params(ScopedParams):
    domain: Annotated[str | None, Field(description="Only ranges of this NVTX domain; omit for all")] = None
    max_depth: Annotated[int | None, Field(
        description="Deepest push/pop level to include (0 = outermost); start/end ranges are kept", ge=0)] = None
    by_depth: Annotated[bool, Field(description="Group by (text, depth); false merges depths")] = True
    merge_numbers: Annotated[bool, Field(description="Replace digit runs by '#' before grouping")] = True
    limit: LimitParam = DEFAULT_LIMIT


class RangeRow(BaseModel):
    name: str
    depth: int | None = Field(description="push/pop depth; null for start/end ranges or when by_depth=false")
    count: int
    cpu_ns: int
    mean_cpu_ns: float
    kernel_count: int
    gpu_ns: int
    gpu_span_ns: int


class PhaseRow(BaseModel):
    phase: str
    count: int
    cpu_ns: int
    cpu_pct: float
    gpu_ns: int


class Result(Output):
    scope: Scope
    has_nvtx: bool
    note: str | None = Field(description="why there are no rows, and how to capture NVTX")
    range_count: int
    rows: list[RangeRow] = Field(description="most CPU time first")
    truncated: bool
    total_rows: int
    phase_depth: int | None = Field(description="depth the phase split was taken at; null when no phases")
    phases: list[PhaseRow]


# Kernel launches join ranges of the same thread through time buckets (hash joins, no sort of the ranges):
# a launch probes its bucket and the one before; a range up to one bucket long sits in its start bucket
# (fine buckets for short ranges, coarse for longer), a longer one in every coarse bucket it covers
# (matched by the launch's own bucket only, so once). Ranges are read narrow for the join, once per bucket class
# (not materialized: a scan of the model is cheaper than writing and rereading the ranges), and with text for the
# grouping, which is cheaper than carrying text through the join.
RANGES = """
  FROM nvtx WHERE end_ns IS NOT NULL AND start_ns >= $start AND start_ns < $end
    AND ($domain IS NULL OR domain = $domain) AND ($max_depth IS NULL OR coalesce(depth, 0) <= $max_depth)"""
SQL = ("""
WITH r AS NOT MATERIALIZED (
  SELECT rowid AS rid, (pid << 24) | tid AS th, start_ns, end_ns, end_ns - start_ns AS d""" + RANGES + "),"
       + sql_beside(__package__, "nvtx_range_kernels.sql") + RANGES + """) LEFT JOIN per p USING (rid)
  GROUP BY text, depth)
SELECT CASE WHEN $merge THEN regexp_replace(coalesce(text, ''), '[0-9]+', '#', 'g') ELSE coalesce(text, '') END
       AS name, depth, sum(n)::BIGINT, sum(cpu)::BIGINT, sum(kn)::BIGINT, sum(gpu)::BIGINT, sum(span)::BIGINT
FROM g GROUP BY ALL ORDER BY 4 DESC, 1, 2
""")


def _phase_of(name: str) -> str:
    return next((phase for phase, pattern in PHASES if pattern.search(name)), "other")


def _phases(groups: list[RangeRow]) -> tuple[int | None, list[PhaseRow]]:
    """Phase split at the shallowest depth where two or more named phases hold half the CPU time."""
    for depth in sorted({g.depth for g in groups if g.depth is not None}):
        at = [(g, _phase_of(g.name)) for g in groups if g.depth == depth]
        cpu_total = sum(g.cpu_ns for g, _ in at)
        named = sum(g.cpu_ns for g, p in at if p != "other")
        if len({p for _, p in at} - {"other"}) < 2 or named < PHASE_COVER_PCT / 100 * cpu_total:
            continue
        rows = [PhaseRow(phase=phase, count=sum(g.count for g, p in at if p == phase),
                         cpu_ns=sum(g.cpu_ns for g, p in at if p == phase),
                         cpu_pct=pct(sum(g.cpu_ns for g, p in at if p == phase), cpu_total),
                         gpu_ns=sum(g.gpu_ns for g, p in at if p == phase))
                for phase in PHASE_ORDER if any(p == phase for _, p in at)]
        return depth, rows
    return None, []


def _merge_depths(groups: list[RangeRow]) -> list[RangeRow]:
    merged: dict[str, RangeRow] = {}
    for g in groups:
        m = merged.setdefault(g.name, RangeRow(name=g.name, depth=None, count=0, cpu_ns=0, mean_cpu_ns=0,
                                               kernel_count=0, gpu_ns=0, gpu_span_ns=0))
        m.count, m.cpu_ns, m.kernel_count = m.count + g.count, m.cpu_ns + g.cpu_ns, m.kernel_count + g.kernel_count
        m.gpu_ns, m.gpu_span_ns = m.gpu_ns + g.gpu_ns, m.gpu_span_ns + g.gpu_span_ns
    for m in merged.values():
        m.mean_cpu_ns = round(m.cpu_ns / m.count, 1)
    return sorted(merged.values(), key=lambda m: (-m.cpu_ns, m.name))


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    args = {"start": scope.start_ns, "end": scope.end_ns, "devices": scope.devices, "domain": params.domain,
            "max_depth": params.max_depth, "merge": params.merge_numbers, "fine": FINE_BUCKET_NS,
            "coarse": COARSE_BUCKET_NS}
    groups = [RangeRow(name=r[0], depth=r[1], count=r[2], cpu_ns=r[3], mean_cpu_ns=round(r[3] / r[2], 1),
                       kernel_count=r[4], gpu_ns=r[5], gpu_span_ns=r[6]) for r in con.execute(SQL, args).fetchall()]
    phase_depth, phases = _phases(groups)
    rows = groups if params.by_depth else _merge_depths(groups)
    note = None
    if not groups:
        flag = con.execute("SELECT capture_flag FROM capabilities WHERE data = 'nvtx'").fetchone()
        capture = flag[0] if flag else remedy(con, ("nvtx",), bare=True)
        ranges = one_row(con.execute("SELECT count(*) FROM nvtx"))
        note = ("no NVTX ranges match in this window" if ranges[0]
                else f"the profile has no NVTX ranges; capture them with {capture}")
    result = Result(scope=scope, has_nvtx=bool(groups), note=note, range_count=sum(g.count for g in groups),
                    rows=rows[:params.limit], truncated=len(rows) > params.limit, total_rows=len(rows),
                    phase_depth=phase_depth, phases=phases)
    return result


def render(result: Result) -> str:
    if not result.has_nvtx:
        return f"No NVTX ranges: {result.note}"
    lines = [f"{result.range_count:,} NVTX ranges in {result.total_rows:,} groups; CPU time (sum of durations) "
             "and GPU time of the kernels launched inside:"]
    lines.extend(f"{ms(r.cpu_ns):>16} cpu  {ms(r.gpu_ns):>14} gpu  x{r.count:<7,} "
                 f"{'' if r.depth is None else f'[d{r.depth}] '}{r.name[:90]}" for r in result.rows)
    if result.truncated:
        lines.extend(more_rows(result, result.total_rows - len(result.rows), "groups"))
    if result.phases:
        lines.append(f"phases at depth {result.phase_depth}: " + ", ".join(
            f"{p.phase} {p.cpu_pct:.1f}% ({ms(p.cpu_ns)} cpu, {ms(p.gpu_ns)} gpu)" for p in result.phases))
    return "\n".join(lines)
