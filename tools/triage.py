"""Why is this GPU job slow? Every detector, findings ranked by the time they cost, with the fix.

Runs each detector skill on the whole profile with its defaults and ranks their findings by
time_at_stake_ns (one per root cause and device, the costliest kept). The run is classified
from device-time shares over the GPU-active window, summed over devices in scope:
compute_pct (compute kernels), transfer_pct (memcpy + memset + copy kernels),
communication_pct (NCCL kernels) and idle_pct (100 - union busy %, from gpu_utilization).
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.profiles.errors import InvalidRequest
from nsightful.resources import book
from nsightful.tools.common import Finding, ProfileParams, ms, pct

DETECTORS = ("gpu_utilization", "gpu_idle_gaps", "top_kernels", "kernel_launch_overhead", "memory_transfers",
             "sync_analysis", "nccl_breakdown", "thread_utilization", "iterations", "nvtx_breakdown")
IDLE_DOMINATED_PCT = 40.0  # idle above this share of the active window outweighs any kernel-level tuning
MAX_FINDINGS = 100  # every finding cites a book entry; past this a model's context is the limit
SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2, "info": 3}
Bound = Literal["compute-bound", "memory/transfer-bound", "communication-bound", "host-bound", "idle-dominated",
                "no GPU activity"]


class Params(ProfileParams):
    limit: Annotated[int, Field(description="Most findings returned, costliest first; the rest are counted in "
                                            "total_findings", ge=1, le=MAX_FINDINGS)] = 10


class RankedFinding(Finding):
    rank: int
    source_tool: str = Field(description="the tool whose detector raised it")
    confidence: Literal["high", "medium", "low"] = Field(description="high: direct measurement above threshold; "
                                                                     "medium/low: inferred")
    book_uri: str
    book_title: str
    fix: str = Field(description="the first fix from the book entry")
    verify: str = Field(description="how to confirm the fix, from the book entry")


class Missing(BaseModel):
    data: str
    capture_flag: str


class Classification(BaseModel):
    bound: Bound
    compute_pct: float
    transfer_pct: float
    communication_pct: float
    idle_pct: float
    reason: str


class Result(BaseModel):
    profile: str
    classification: Classification
    findings: list[RankedFinding] = Field(description="at most `limit`, ranked by time at stake")
    total_findings: int = Field(description="findings before the limit")
    truncated: bool
    missing: list[Missing] = Field(description="what the profile cannot tell, and the nsys flag that captures it")
    skipped: list[str] = Field(description="detectors that could not run on this profile, with why")


SHARES_SQL = """
WITH w AS (SELECT gpu_start_ns AS s, gpu_end_ns AS e, (SELECT count(*) FROM gpus) AS n FROM meta),
busy AS (
  SELECT category AS cat, duration_ns AS d FROM kernels
  UNION ALL SELECT 'copy', duration_ns FROM memcpy UNION ALL SELECT 'copy', duration_ns FROM memset)
SELECT coalesce(sum(d) FILTER (WHERE cat = 'compute' OR cat = 'other'), 0),
       coalesce(sum(d) FILTER (WHERE cat = 'copy'), 0), coalesce(sum(d) FILTER (WHERE cat = 'nccl'), 0),
       (SELECT (e - s) * n FROM w)
FROM busy
"""


def _confidence(f: Finding) -> Literal["high", "medium", "low"]:
    return {"high": "high", "medium": "medium"}.get(f.severity, "low")


def _rank(found: list[tuple[str, Finding]], limit: int) -> tuple[list[RankedFinding], int]:
    """The `limit` findings to show, costliest first, and how many there were in all.

    One per (root cause, device), the costliest kept. When cut, every root cause's costliest
    finding is kept before any per-device repeat, so eight devices with the same problem cannot
    push a different cause off the list.
    """
    best: dict[tuple[str, int | None], tuple[str, Finding]] = {}
    for tool, f in found:
        key = (f.root_cause, f.device)
        if key not in best or f.time_at_stake_ns > best[key][1].time_at_stake_ns:
            best[key] = (tool, f)
    ordered = sorted(best.values(), key=lambda tf: (-tf[1].time_at_stake_ns, SEVERITY_RANK[tf[1].severity]))
    leads, repeats, seen = [], [], set()
    for tf in ordered:
        (repeats if tf[1].root_cause in seen else leads).append(tf)
        seen.add(tf[1].root_cause)
    chosen = {id(tf) for tf in (leads + repeats)[:limit]}
    out = []
    for tool, f in (tf for tf in ordered if id(tf) in chosen):
        entry = book.get_entry(f.root_cause)
        out.append(RankedFinding(**f.model_dump(), rank=len(out) + 1, source_tool=tool, confidence=_confidence(f),
                                 book_uri=book.entry_uri(entry.id), book_title=entry.title,
                                 fix=entry.fix_for(("pytorch", "python", "generic"), f.tags).text,
                                 verify=entry.verify))
    return out, len(ordered)


def classify(con: duckdb.DuckDBPyConnection, idle_pct: float | None, host_flags: set[str]) -> Classification:
    compute, copy, nccl, capacity = con.execute(SHARES_SQL).fetchone()
    if not capacity:
        return Classification(bound="no GPU activity", compute_pct=0, transfer_pct=0, communication_pct=0,
                              idle_pct=0, reason="the profile has no kernels, copies or memsets")
    shares = {"compute-bound": pct(compute, capacity), "memory/transfer-bound": pct(copy, capacity),
              "communication-bound": pct(nccl, capacity)}
    idle = idle_pct if idle_pct is not None else max(0.0, 100 - sum(shares.values()))
    if idle >= IDLE_DOMINATED_PCT:
        host = host_flags & {"cpu-bottleneck", "small-kernel-overhead", "excessive-synchronization"}
        bound: Bound = "host-bound" if host else "idle-dominated"
        reason = (f"devices idle {idle:.1f}% of the active window"
                  + (f", and the host shows {', '.join(sorted(host))}" if host else ", host cause not evident"))
    else:
        bound = max(shares, key=shares.get)
        reason = f"largest device-time share: {bound.split('-')[0]} at {shares[bound]:.1f}% (idle {idle:.1f}%)"
    return Classification(bound=bound, compute_pct=shares["compute-bound"],
                          transfer_pct=shares["memory/transfer-bound"],
                          communication_pct=shares["communication-bound"], idle_pct=round(idle, 2), reason=reason)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    from nsightful.tools import skills
    modules = skills()
    found: list[tuple[str, Finding]] = []
    skipped: list[str] = []
    idle_pct = None
    for name in DETECTORS:
        module = modules[name]
        try:
            result = module.run(con, module.Params(profile=params.profile))
        except InvalidRequest as exc:
            skipped.append(f"{name}: {exc}")
            continue
        found.extend((name, f) for f in result.findings)
        if name == "gpu_utilization":
            idle_pct = getattr(result, "idle_pct", None)
    ranked, total = _rank(found, params.limit)
    missing = [Missing(data=d, capture_flag=f) for d, f in
               con.execute("SELECT data, capture_flag FROM capabilities WHERE NOT present ORDER BY data").fetchall()]
    causes = {f.root_cause for _, f in found}
    return Result(profile=params.profile, classification=classify(con, idle_pct, causes), findings=ranked,
                  total_findings=total, truncated=total > len(ranked), missing=missing, skipped=skipped)


def render(result: Result) -> str:
    c = result.classification
    lines = [f"{c.bound}: {c.reason}",
             f"  compute {c.compute_pct:.1f}%  transfer {c.transfer_pct:.1f}%  communication "
             f"{c.communication_pct:.1f}%  idle {c.idle_pct:.1f}%", ""]
    if not result.findings:
        lines.append("No detector fired: nothing above its threshold.")
    explained: set[str] = set()
    for f in result.findings:
        lines.append(f"{f.rank}. [{f.severity}] {f.title}: ~{ms(f.time_at_stake_ns)} at stake")
        if f.root_cause in explained:
            lines.append(f"   cause: {f.root_cause} (see above)")
            continue
        explained.add(f.root_cause)
        lines.append(f"   cause: {f.book_title} <{f.book_uri}>")
        lines.append(f"   fix: {f.fix}")
        lines.append(f"   verify: {f.verify}")
    if result.truncated:
        lines.append(f"... {result.total_findings - len(result.findings)} smaller findings: raise `limit` to see them")
    if result.missing:
        lines.append("")
        lines.append("Not in this profile: " + "; ".join(f"{m.data} ({m.capture_flag})" for m in result.missing))
    return "\n".join(lines)


def render_markdown(result: Result) -> str:
    c = result.classification
    lines = ["## nsightful triage", "", f"**{c.bound}**: {c.reason}", "",
             "| share | % |", "|---|---|", f"| compute | {c.compute_pct:.1f} |", f"| transfer | {c.transfer_pct:.1f} |",
             f"| communication | {c.communication_pct:.1f} |", f"| idle | {c.idle_pct:.1f} |", ""]
    if result.findings:
        lines += ["| # | severity | finding | at stake | root cause | fix |", "|---|---|---|---|---|---|"]
        for f in result.findings:
            fix = f.fix.replace("|", "\\|")
            lines.append(f"| {f.rank} | {f.severity} | {f.title.replace('|', '/')} | {ms(f.time_at_stake_ns)} | "
                         f"[{f.root_cause}]({f.book_uri}) | {fix} |")
    if result.truncated:
        lines += ["", f"{result.total_findings - len(result.findings)} smaller findings not shown."]
    if result.missing:
        lines += ["", "**Not in this profile:** " + "; ".join(f"{m.data} (`{m.capture_flag}`)" for m in result.missing)]
    return "\n".join(lines)
