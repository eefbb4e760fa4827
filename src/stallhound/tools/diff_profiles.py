"""Did my change make it faster, and why? Two profiles compared figure by figure, with a verdict.

Each side is measured on its triage window (steady iterations when found, by the steps of `range_name` on both sides
when given, else GPU-active; tools/diff/side.py), with
the work that window launched (tools/diff/work.py). Figures are per steady iteration when both sides have them,
found the same way; else, when both ran the same work, totals of the window; else per second of the window (`basis`
says which): step time, the GPU-active span of the work and the host's time issuing it, GPU busy and idle, the
compute / copy / communication / idle shares, kernel time by kernel (slower, faster, new, gone, with counts), NCCL
exposed time, copy time by direction and pageable copies, host time blocked in syncs, launch overhead, in total and
per device. Triage's findings on both sides are matched by root cause (gone, new, smaller, bigger: did the
bottleneck move?). The verdict, the figure that decided it and its threshold are tools/diff/verdict.py's.
"""

from __future__ import annotations

from typing import Annotated

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import MAX_LIMIT, Output, ProfileRef, Scope, more_rows, ms
from stallhound.tools import iterations
from stallhound.tools.diff.rows import (
    SHARE_UNIT,
    FigureRow,
    FindingChange,
    KernelChange,
    device_figures,
    figure_row,
    finding_changes,
    kernel_changes,
    shown,
    total_figures,
)
from stallhound.tools.diff.side import Side, measure
from stallhound.tools.diff.verdict import LABELS, Basis, Decision, basis_of, decide

DEFAULT_KERNEL_ROWS = 10  # kernel rows by default: with the figures and findings about 4,000 characters of text
CUT_HINT = "raise `limit` for more kernel rows"

STEP_RANGE = f"{iterations.RANGE_NAME}; the same on both sides"


class Params(BaseModel):
    before: ProfileRef
    after: ProfileRef
    range_name: Annotated[str | None, Field(description=STEP_RANGE)] = None
    limit: Annotated[int, Field(description=f"Most kernel rows returned, largest change first (1-{MAX_LIMIT})",
                                ge=1, le=MAX_LIMIT)] = DEFAULT_KERNEL_ROWS


class SideSummary(BaseModel):
    profile: str
    program: str
    gpus: list[str]
    window: Scope | None = Field(description="triage's window on this side; null when it has no timed events")
    window_note: str
    iterations: int = Field(description="steady iterations in the window (0: none)")
    step_method: str | None = Field(description="how they were found ('nvtx:<range>', 'graph:<call>', "
                                                "'kernel_pattern:<kernel>'); null without steady iterations")
    bound: str = Field(description="triage's classification of the run")


class Result(Output):
    before: SideSummary
    after: SideSummary
    basis: Basis
    decision: Decision
    figures: list[FigureRow] = Field(description="totals over devices")
    devices: list[FigureRow] = Field(description="per device figures")
    kernels: list[KernelChange] = Field(description="largest change first, at most `limit`")
    total_kernels: int = Field(description="kernel rows before the limit")
    truncated: bool
    findings: list[FindingChange] = Field(description="triage's findings matched by root cause, largest change first")


def run(before: duckdb.DuckDBPyConnection, after: duckdb.DuckDBPyConnection, params: Params) -> Result:
    return compare(measure(before, params.before, params.range_name), measure(after, params.after, params.range_name),
                   params)


def compare(before: Side, after: Side, params: Params) -> Result:
    basis = basis_of(before, after)
    per = {id(s): _unit(s, basis) for s in (before, after)}

    def norm(side: Side, value: float) -> float:
        return round(value / per[id(side)], 1) if per[id(side)] else 0.0

    figures = [figure_row(name, None, unit, b, a) for name, unit, b, a in total_figures(before, after, basis, norm)]
    devices = [figure_row(name, d, unit, b, a) for name, d, unit, b, a in device_figures(before, after, basis, norm)]
    kernels = kernel_changes(before, after, norm)
    return Result(before=_summary(before), after=_summary(after), basis=basis, decision=decide(before, after),
                  figures=figures, devices=devices, kernels=kernels[:params.limit], total_kernels=len(kernels),
                  truncated=len(kernels) > params.limit, findings=finding_changes(before, after, norm))


def _unit(side: Side, basis: Basis) -> float:
    """Iterations, seconds of window, or 1 (totals of the same work), that one side's figures are divided by."""
    if basis == "per_iteration":
        return side.iterations
    if basis == "per_run":
        return 1.0
    return side.window.duration_ns / 1e9 if side.window else 0.0


def _summary(side: Side) -> SideSummary:
    return SideSummary(profile=side.profile, program=side.program, gpus=side.gpus,
                       window=side.window, window_note=side.window_note,
                       iterations=side.iterations, step_method=side.step_method, bound=side.classification.bound)


def _length(side: SideSummary) -> str:
    return ms(side.window.duration_ns) if side.window else "none"


def _change(row: FigureRow) -> str:
    if row.change_pct is None:
        return ""
    return f" ({row.change_pct:+.1f} {'points' if row.unit == SHARE_UNIT else '%'})".replace(" %", "%")


def _compared(d: Decision) -> list[str]:
    """The times of the work the verdict weighed, the deciding one marked."""
    return [f"  {LABELS[c.figure]:27} {ms(c.before)} -> {ms(c.after)} ({c.change_pct:+.1f}%, counts above "
            f"{c.threshold_pct:.1f}%){'  <- decided' if c.figure == d.figure else ''}" for c in d.compared]


def render(result: Result) -> str:
    d = result.decision
    lines = [f"verdict: {d.verdict}: {d.reason}", *[f"warning: {w}" for w in d.warnings], *_compared(d)]
    for label, s in (("before", result.before), ("after", result.after)):
        lines.append(f"{label}: {s.profile}, {s.program}, {len(s.gpus)} GPU(s), {s.bound}; window {_length(s)}, "
                     f"{s.window_note}")
    lines += ["", f"figures {result.basis.replace('_', ' ')} (before -> after):"]
    lines += [f"  {r.figure:20} {shown(r.before, r.unit)} -> {shown(r.after, r.unit)}{_change(r)}"
              for r in result.figures]
    devices = sorted({r.device for r in result.devices if r.device is not None})  # each per-device row names one
    for device in devices:
        parts = [f"{r.figure} {shown(r.before, r.unit)} -> {shown(r.after, r.unit)}{_change(r)}"
                 for r in result.devices if r.device == device]
        lines.append(f"  device {device}: " + "; ".join(parts))
    lines += ["", "kernels, largest change first (time per unit, launches):"]
    lines += [f"  {k.status:6} {k.name[:60]}: {ms(k.before_ns)} -> {ms(k.after_ns)}, "
              f"{k.before_count:,.1f} -> {k.after_count:,.1f}" for k in result.kernels]
    lines += more_rows(result, result.total_kernels - len(result.kernels), "kernels")
    lines += ["", "findings by root cause (time at stake per unit):"]
    lines += [f"  {f.status:7} {f.root_cause}: {ms(f.before_ns)} -> {ms(f.after_ns)}" for f in result.findings]
    if not result.findings:
        lines.append("  none on either side")
    return "\n".join(lines)


def render_markdown(result: Result) -> str:
    d = result.decision
    lines = ["## stallhound diff", "", f"**{d.verdict}**: {d.reason}", ""]
    lines += [f"- {line.strip()}" for line in _compared(d)] + ([""] if d.compared else [])
    lines += [f"> warning: {w}" for w in d.warnings] + ([""] if d.warnings else [])
    lines += ["| | before | after |", "|---|---|---|",
              f"| profile | {result.before.profile} | {result.after.profile} |",
              f"| window | {_length(result.before)} | {_length(result.after)} |",
              f"| steady iterations | {result.before.iterations} | {result.after.iterations} |",
              f"| bound | {result.before.bound} | {result.after.bound} |", "",
              f"| figure ({result.basis.replace('_', ' ')}) | before | after | change |", "|---|---|---|---|"]
    lines += [f"| {r.figure} | {shown(r.before, r.unit)} | {shown(r.after, r.unit)} | {_change(r).strip(' ()')} |"
              for r in result.figures]
    lines += ["", "| kernel | change | before | after |", "|---|---|---|---|"]
    lines += [f"| `{k.name[:60]}` | {k.status} | {ms(k.before_ns)} | {ms(k.after_ns)} |" for k in result.kernels]
    lines += ["", "| root cause | finding | before | after |", "|---|---|---|---|"]
    lines += [f"| {f.root_cause} | {f.status} | {ms(f.before_ns)} | {ms(f.after_ns)} |" for f in result.findings]
    return "\n".join(lines)
