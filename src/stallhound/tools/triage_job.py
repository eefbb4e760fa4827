"""Why is this job slow? The cross-rank findings and the triage of the rank that matters, ranked by time at stake.

The cross-rank findings are rank_imbalance's; every finding comes with the book's fix for the program profiled.

The rank that matters: the straggler when rank_imbalance names one (every other rank waits for it), else the rank
with the longest step time (rank_imbalance's step_ns, over the steps of the same index on every rank: ProfilerStep#10
on each; `range_name` picks the step range as iterations takes it), else, when no rank has iterations, the one
with the longest GPU-active span (window_ns); `chosen_by` and `chosen_why` say which and why, `step_note` how the
steps were found (the method) and matched. With more than
rank_imbalance's MAX_LIMIT ranks, the choice is among the MAX_LIMIT it lists first (stragglers, then slow steps).
Its triage is tools/triage.py on that rank alone, as on its own profile: its window (steady state when found, by
the steps of `range_name` when that rank has them),
its program, every detector; each of its findings names its `rank`. Cross-rank findings (nccl-straggler,
compute-communication-imbalance) are job-wide: `rank` null, the ranks in the evidence, time at stake the wait of a
typical other rank (the straggler's peers, or every rank) over the ranks' GPU-active spans. The fix shown is the
book's first for the triaged rank's program family (analysis/program.py), else the generic one. Times in ns.
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import rank_figures as figures
from stallhound.analysis import rules
from stallhound.analysis.common import MAX_LIMIT, Finding, Output, as_result, leads_first, more_rows, ms, stake_said
from stallhound.analysis.contracts import run_skill
from stallhound.analysis.program import Program
from stallhound.analysis.shares import Classification
from stallhound.tools import detectors, rank_imbalance, triage

ChosenBy = Literal["straggler", "slowest_step", "longest_window"]
STEPS_NAMED = 4  # compared steps listed in chosen_why; more are shown as first..last


class Params(BaseModel):
    job: rank_imbalance.JobRef
    range_name: Annotated[str | None, Field(
        description=rank_imbalance.Params.model_fields["range_name"].description)] = None
    limit: Annotated[int, Field(description="Most findings returned, costliest first; the rest are counted in "
                                            "total_findings", ge=1, le=triage.MAX_FINDINGS)] = 10


class JobFinding(triage.CitedFinding):
    position: int = Field(description="1 for the costliest finding")
    rank: int | None = Field(description="the rank it was found on; null for a cross-rank (job-wide) finding")


class Result(Output):
    job: str
    ranks: int
    straggler: int | None = Field(description="the rank the others wait for, when rank_imbalance names one")
    verdict: str = Field(description="rank_imbalance's: why a straggler is or is not named")
    step_note: str = Field(description="rank_imbalance's: how the ranks' steps were found (the method) and matched")
    triaged_rank: int = Field(description="the rank whose own triage is included")
    chosen_by: ChosenBy
    chosen_why: str
    program: Program = Field(description="the triaged rank's program")
    window_note: str = Field(description="the triaged rank's analysed window: how it was chosen")
    classification: Classification = Field(description="the triaged rank's GPU time split")
    findings: list[JobFinding] = Field(description="at most `limit`, ranked by time at stake")
    total_findings: int = Field(description="findings before the limit: cross-rank plus the triaged rank's")
    truncated: bool
    time_at_stake_ns: int = Field(description="sum over all findings")
    missing: list[rules.Missing] = Field(description="what the triaged rank's profile cannot tell, and the flag")
    skipped: list[str] = Field(description="detectors that could not run on the triaged rank, with why")


def _chosen(imbalance: rank_imbalance.Result) -> tuple[int, ChosenBy, str]:
    if imbalance.straggler is not None:
        s = imbalance.straggler
        return s.rank, "straggler", (f"rank {s.rank} is the straggler: the other ranks wait {ms(s.peer_wait_ns)} "
                                     f"each (median) for it, so what makes it late is what slows the job")
    stepped = [r for r in imbalance.rows if r.step_ns is not None]
    if stepped:
        top = max(stepped, key=lambda r: (r.step_ns, -r.rank))
        keys = imbalance.steps_compared
        shown = ", ".join(keys) if len(keys) <= STEPS_NAMED else f"{keys[0]}..{keys[-1]}"
        return top.rank, "slowest_step", (f"no straggler named; rank {top.rank} has the longest step "
                                          f"({ms(top.step_ns)}; step(s) {shown} compared on every rank, matched by "
                                          f"{imbalance.step_match}; found by {top.step_method})")
    top = max(imbalance.rows, key=lambda r: (r.window_ns, -r.rank))
    return top.rank, "longest_window", (f"no straggler named and no iterations found; rank {top.rank} has the "
                                        f"longest GPU-active span ({ms(top.window_ns)})")


def _stepped_by(imbalance: rank_imbalance.Result, rank: int, params: Params) -> str | None:
    """range_name for the rank's triage window: the range asked for, where that rank has steps by it."""
    return params.range_name if any(r.rank == rank and r.steps for r in imbalance.rows) else None


def _cited(finding: Finding, tool: str, rank: int | None, chain: tuple[str, ...], context: tuple[str, ...]
           ) -> JobFinding:
    return JobFinding(**triage.citation(finding, tool, chain, context), position=0, rank=rank)


def _cross_rank(con: duckdb.DuckDBPyConnection, params: Params, imbalance: rank_imbalance.Result
                ) -> list[tuple[str, Finding]]:
    """(detector, finding) of every job detector; rank_imbalance's from the run that chose the rank."""
    return [(name, f) for name, module, _ in detectors("job") for f in (
        imbalance if module is rank_imbalance else as_result(run_skill(con, module, module.Params(job=params.job)),
                                                             module.Result)).findings]


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    imbalance = as_result(run_skill(con, rank_imbalance, rank_imbalance.Params(
        job=params.job, range_name=params.range_name, limit=MAX_LIMIT)), rank_imbalance.Result)
    rank, chosen_by, why = _chosen(imbalance)
    with figures.rank_view(con, rank) as cur:
        own = triage.run(cur, triage.Params(profile=f"rank {rank}", range_name=_stepped_by(imbalance, rank, params),
                                            limit=triage.MAX_FINDINGS))
    chain = tuple(own.program.fix_chain)
    cross = _cross_rank(con, params, imbalance)
    context = tuple(own.program.fix_context)
    found = [_cited(f, name, None, chain, context) for name, f in cross]
    found += [_cited(f, f.source_tool, rank, chain, context) for f in own.findings]
    total = len(cross) + own.total_findings
    kept = leads_first(found, lambda f: f, params.limit)
    straggler = imbalance.straggler.rank if imbalance.straggler else None
    return Result(job=params.job, ranks=imbalance.ranks, straggler=straggler,
                  findings=[f.model_copy(update={"position": i}) for i, f in enumerate(kept, start=1)],
                  verdict=imbalance.verdict, step_note=imbalance.step_note, triaged_rank=rank,
                  chosen_by=chosen_by, chosen_why=why,
                  program=own.program, window_note=own.window_note, classification=own.classification,
                  total_findings=total, truncated=total > len(kept),
                  time_at_stake_ns=sum(f.time_at_stake_ns for _, f in cross) + own.time_at_stake_ns,
                  missing=own.missing, skipped=own.skipped)


def render(result: Result) -> str:
    c = result.classification
    lines = [f"job {result.job}: {result.ranks} ranks; {result.verdict}",
             f"triaged rank {result.triaged_rank} ({result.chosen_by}): {result.chosen_why}",
             f"  rank {result.triaged_rank}: {c.bound}: {c.reason}; window: {result.window_note}; "
             f"program: {result.program.kind}", f"steps: {result.step_note}", ""]
    if not result.findings:
        lines.append("No detector fired on the job or on the triaged rank: nothing above its threshold.")
    explained: set[str] = set()
    for f in result.findings:
        where = "job-wide" if f.rank is None else f"rank {f.rank}"
        lines.append(f"{f.position}. [{f.severity}] ({where}) {f.title}{stake_said(f.time_at_stake_ns)}")
        lines += triage.cited_lines(f, explained)
    if result.truncated:
        lines.extend(more_rows(result, result.total_findings - len(result.findings), "findings"))
    if result.missing:
        lines += ["", f"Not in rank {result.triaged_rank}'s profile: "
                  + "; ".join(f"{m.data} ({m.capture_flag})" for m in result.missing)]
    return "\n".join(lines)
