"""Did the fix for this root cause work? The verify step of its book entry, run on a before and an after profile.

Every book entry ends with how to verify its fix ("re-profile and run X: Y should drop"). This runs those figures
on both profiles through diff_profiles (same windows, same basis: per steady iteration, or totals when both ran
the same work: the same sync calls taking longer are more sync time, never fewer calls per second) and answers:
pass: the finding is gone or smaller, or every figure the entry names moved the way it should, and nothing moved
the wrong way and the work did not get slower; fail: the finding grew or appeared, a figure moved the wrong
way, or the work got slower; unclear: nothing moved beyond its threshold, or the runs are not comparable (among
them, runs of different work without steady iterations: only per-second rates compare, and a rate cannot tell a
fix from a change of work), or the work differs and the step did not get faster (more work on an idle GPU shrinks
an idle finding without fixing anything).
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field, field_validator

from stallhound import book
from stallhound.analysis.common import Output, ProfileRef, ms
from stallhound.tools import diff_profiles
from stallhound.tools.diff.rows import SHARE_UNIT, FigureRow, FindingChange, shown
from stallhound.tools.diff.side import Side, measure
from stallhound.tools.diff.verdict import Decision
from stallhound.tools.diff_profiles import STEP_RANGE

FIGURE_CHANGE_PCT = 10.0  # a verify figure moving less than this (% of before) is within run-to-run variation
SHARE_CHANGE_POINTS = 2.0  # ... and a share less than this many points
Direction = Literal["down", "up"]
Moved = Literal["as expected", "wrong way", "unchanged"]
Answer = Literal["pass", "fail", "unclear"]

# The diff figures each entry's verify step names (book/<id>.md `verify`), and which way a working fix moves them.
# The finding itself and diff_profiles' verdict are checked for every entry.
VERIFY_FIGURES: dict[str, tuple[tuple[str, Direction], ...]] = {
    "alloc-in-loop": (("GPU idle", "down"),),
    "blocking-d2h-sync": (("sync blocked", "down"), ("GPU idle", "down")),
    "compute-communication-imbalance": (("NCCL exposed", "down"), ("communication share", "down")),
    "cpu-bottleneck": (("idle share", "down"), ("launch API", "down")),
    "dataloader-starvation": (("idle share", "down"),),
    "excessive-h2d-transfers": (("copy H2D", "down"),),
    "excessive-synchronization": (("sync calls", "down"), ("sync blocked", "down")),
    "fp32-gemm-no-tensor-cores": (("kernel time", "down"),),
    "gc-pauses": (("GPU idle", "down"),),
    "gpu-bubbles": (("GPU idle", "down"), ("idle share", "down")),
    "host-communication": (("GPU idle", "down"),),
    "kernel-hotspot": (("kernel time", "down"),),
    "module-loading-hot-path": (("GPU idle", "down"),),
    "nccl-on-compute-stream": (("NCCL exposed", "down"),),
    "nccl-serialization": (("NCCL exposed", "down"), ("communication share", "down")),
    "nccl-straggler": (("communication share", "down"),),
    "pageable-host-memory": (("pageable copies", "down"),),
    "profiler-overhead": (("GPU idle", "down"),),
    "profiler-window-on-warmup": (),
    "small-kernel-overhead": (("tiny kernels", "down"), ("launch API", "down")),
    "tokenization-on-critical-path": (("idle share", "down"),),
    "torch-compile-recompilation": (("GPU idle", "down"),),
    "undersized-grid": (("kernel time", "down"),),
    "unfused-attention": (("kernel time", "down"),),
    "unified-memory-migration": (("kernel time", "down"), ("GPU idle", "down")),  # faulting work and its stalls
    "unneeded-activation-checkpointing": (("kernel time", "down"),),
}


class Params(BaseModel):
    before: ProfileRef
    after: ProfileRef
    root_cause: Annotated[str, Field(description="id of the book entry whose fix to verify, e.g. gpu-bubbles (the "
                                                 "root_cause of a triage finding; stallhound://book lists them)")]
    range_name: Annotated[str | None, Field(description=STEP_RANGE)] = None

    @field_validator("root_cause")
    @classmethod
    def _known(cls, value: str) -> str:
        book.get_entry(value)  # UnknownEntry names the valid ids
        return value


class Check(BaseModel):
    figure: str
    expected: Direction
    unit: str
    before: float
    after: float
    change_pct: float | None = Field(description=f"as in diff_profiles: % of before, points for '{SHARE_UNIT}'")
    moved: Moved


class Result(Output):
    root_cause: str
    book_uri: str
    verify: str = Field(description="the book entry's verify step")
    answer: Answer
    reason: str
    finding: FindingChange | None = Field(description="triage's finding of this cause on both sides; null when "
                                                      "neither side raises it")
    checks: list[Check] = Field(description="the figures the verify step names, before and after")
    decision: Decision = Field(description="diff_profiles' verdict on the time the work took")


def run(before: duckdb.DuckDBPyConnection, after: duckdb.DuckDBPyConnection, params: Params) -> Result:
    return compare(measure(before, params.before, params.range_name), measure(after, params.after, params.range_name),
                   params)


def compare(before: Side, after: Side, params: Params) -> Result:
    diff = diff_profiles.compare(before, after, diff_profiles.Params(before=params.before, after=params.after,
                                                                     range_name=params.range_name))
    rows = {r.figure: r for r in diff.figures}
    checks = [_check(rows[name], direction) for name, direction in VERIFY_FIGURES[params.root_cause] if name in rows]
    finding = next((f for f in diff.findings if f.root_cause == params.root_cause), None)
    answer, reason = _answer(finding, checks, diff.decision)
    entry = book.get_entry(params.root_cause)
    return Result(root_cause=entry.id, book_uri=book.entry_uri(entry.id), verify=entry.verify, answer=answer,
                  reason=reason, finding=finding, checks=checks, decision=diff.decision)


def _check(row: FigureRow, expected: Direction) -> Check:
    floor = SHARE_CHANGE_POINTS if row.unit == SHARE_UNIT else FIGURE_CHANGE_PCT
    change = row.change_pct if row.change_pct is not None else (100.0 if row.after > row.before else 0.0)
    moved: Moved = ("unchanged" if abs(change) <= floor else
                    "as expected" if (change < 0) == (expected == "down") else "wrong way")
    return Check(figure=row.figure, expected=expected, unit=row.unit, before=row.before, after=row.after,
                 change_pct=row.change_pct, moved=moved)


def _answer(finding: FindingChange | None, checks: list[Check], decision: Decision) -> tuple[Answer, str]:
    wrong = [c.figure for c in checks if c.moved == "wrong way"]
    if finding and finding.status == "new":
        return "fail", f"the finding is new after the change ({_stake(finding, decision)})"
    if decision.basis == "per_second":
        return "unclear", (f"the runs are not comparable: {decision.work_note}, and without steps both share only "
                           "per-second rates compare; capture the same steps of the same program")
    if finding and finding.status == "bigger":
        return "fail", f"the finding is {finding.status} after the change ({_stake(finding, decision)})"
    if wrong:
        return "fail", f"{', '.join(wrong)} moved the wrong way"
    if decision.verdict == "regressed":
        return "fail", f"the work got slower: {decision.reason}"
    if decision.warnings:
        return "unclear", f"the runs may not be comparable: {'; '.join(decision.warnings)}"
    if not decision.same_work and decision.verdict != "improved":
        return "unclear", (f"{decision.work_note}: with other work a fix shows as a faster step, and the step "
                           f"shows {decision.verdict}; more work alone can shrink a finding")
    if finding and finding.status in ("gone", "smaller"):
        return "pass", f"the finding is {finding.status} ({_stake(finding, decision)}); {_verdict(decision)}"
    if finding is None:
        return "unclear", ("triage raises this finding on neither side, so there was nothing to fix here; "
                           "run triage on the before profile for the causes it does find")
    if checks and all(c.moved == "as expected" for c in checks):
        return "pass", f"every figure of the verify step moved as it should; {_verdict(decision)}"
    return "unclear", "the finding is still there and no figure of the verify step moved beyond its threshold"


def _stake(finding: FindingChange, decision: Decision) -> str:
    per = {"per_iteration": " per iteration", "per_run": " in total", "per_second": " per second of window"}
    return f"time at stake {ms(finding.before_ns)} -> {ms(finding.after_ns)}{per[decision.basis]}"


def _per(unit: str) -> str:
    """'ns/iteration' -> 'per iteration', 'calls/s' -> 'calls per s'; a total ('ns', 'calls'): '(calls) in total'."""
    if "/" not in unit:
        return "in total" if unit == "ns" else f"{unit} in total"
    return unit.replace("ns/", "per ", 1) if unit.startswith("ns/") else unit.replace("/", " per ")


def _verdict(decision: Decision) -> str:
    return f"overall {decision.verdict}: {decision.reason}"


def render(result: Result) -> str:
    lines = [f"{result.answer}: {result.reason}", f"verify step ({result.book_uri}): {result.verify}"]
    if result.finding:
        f = result.finding
        lines.append(f"finding {f.root_cause}: {f.status}, {_stake(f, result.decision)}")
    for c in result.checks:
        change = "" if c.change_pct is None else f" ({c.change_pct:+.1f}{' points' if c.unit == SHARE_UNIT else '%'})"
        lines.append(f"  {c.figure} should go {c.expected}: {shown(c.before, c.unit)} -> {shown(c.after, c.unit)} "
                     f"{_per(c.unit)}{change}: {c.moved}")
    d = result.decision
    lines.append(f"overall: {d.verdict} ({d.reason})")
    lines += [f"warning: {w}" for w in d.warnings]
    return "\n".join(lines)
