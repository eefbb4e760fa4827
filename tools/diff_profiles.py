"""Did my change make it faster, and why? Two profiles compared figure by figure, with a verdict.

Each side is measured on its triage window (steady iterations when found, else GPU-active; tools/diff_side.py).
Figures are per steady iteration when both sides have them, else per second of the window (`basis` says which):
step time, GPU busy and idle, the compute / copy / communication / idle shares, kernel time by kernel (slower,
faster, new, gone, with counts), NCCL exposed time, copy time by direction and pageable copies, host time
blocked in syncs, launch overhead, in total and per device. Triage's findings on both sides are matched by root
cause (gone, new, smaller, bigger: did the bottleneck move?). The verdict and its threshold are
tools/diff_verdict.py's.
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.tools.common import MAX_LIMIT, Output, ProfileRef, Scope, more_rows, ms
from nsightful.tools.diff_side import Side, measure
from nsightful.tools.diff_verdict import Basis, Decision, basis_of, decide

DEFAULT_KERNEL_ROWS = 10  # kernel rows by default: with the figures and findings about 4,000 characters of text
KERNEL_CHANGE_PCT = 5.0  # a kernel's time per unit moving less than this is jitter (synth kernels jitter +-4%)
FINDING_CHANGE_PCT = 10.0  # time at stake moving less than this is the same finding, measured again
SHARE_UNIT = "% of window"
CUT_HINT = "raise `limit` for more kernel rows"

Status = Literal["slower", "faster", "new", "gone", "same"]
FindingStatus = Literal["gone", "new", "smaller", "bigger", "same"]


class Params(BaseModel):
    before: ProfileRef
    after: ProfileRef
    limit: Annotated[int, Field(description=f"Most kernel rows returned, largest change first (1-{MAX_LIMIT})",
                                ge=1, le=MAX_LIMIT)] = DEFAULT_KERNEL_ROWS


class SideSummary(BaseModel):
    profile: str
    program: str
    gpus: list[str]
    window: Scope | None = Field(description="triage's window on this side; null when it has no timed events")
    window_note: str
    iterations: int = Field(description="steady iterations in the window (0: none)")
    bound: str = Field(description="triage's classification of the run")


class FigureRow(BaseModel):
    figure: str
    device: int | None = Field(description="null for the total over devices")
    unit: str
    before: float
    after: float
    change_pct: float | None = Field(description=f"after vs before in % of before (null when before is 0); for "
                                                 f"shares (unit '{SHARE_UNIT}') the difference in points")


class KernelChange(BaseModel):
    name: str
    status: Status
    before_ns: float = Field(description="kernel time per unit of `basis`")
    after_ns: float
    before_count: float = Field(description="launches per unit of `basis`")
    after_count: float
    change_ns: float


class FindingChange(BaseModel):
    root_cause: str
    status: FindingStatus
    before_ns: float = Field(description="time at stake per unit of `basis`, summed over devices")
    after_ns: float
    title: str = Field(description="the costliest instance's title, from the after side when it is there")


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
    return compare(measure(before, params.before), measure(after, params.after), params)


def compare(before: Side, after: Side, params: Params) -> Result:
    basis = basis_of(before, after)
    per = {id(s): _unit(s, basis) for s in (before, after)}

    def norm(side: Side, value: float) -> float:
        return round(value / per[id(side)], 1) if per[id(side)] else 0.0

    figures = [_row(name, None, unit, b, a) for name, unit, b, a in _totals(before, after, basis, norm)]
    devices = [_row(name, d, unit, b, a) for name, d, unit, b, a in _per_device(before, after, basis, norm)]
    kernels = _kernels(before, after, norm)
    return Result(before=_summary(before), after=_summary(after), basis=basis, decision=decide(before, after),
                  figures=figures, devices=devices, kernels=kernels[:params.limit], total_kernels=len(kernels),
                  truncated=len(kernels) > params.limit, findings=_findings(before, after, norm))


def _unit(side: Side, basis: Basis) -> float:
    """Iterations, or seconds of window, that one side's figures are divided by."""
    if basis == "per_iteration":
        return side.iterations
    return side.window.duration_ns / 1e9 if side.window else 0.0


def _summary(side: Side) -> SideSummary:
    return SideSummary(profile=side.profile, program=side.program, gpus=side.gpus,
                       window=side.window, window_note=side.window_note,
                       iterations=side.iterations, bound=side.classification.bound)


def _row(figure: str, device: int | None, unit: str, before: float, after: float) -> FigureRow:
    if unit == SHARE_UNIT:
        return FigureRow(figure=figure, device=device, unit=unit, before=before, after=after,
                         change_pct=round(after - before, 2))
    change = round(100 * (after - before) / before, 2) if before else None
    return FigureRow(figure=figure, device=device, unit=unit, before=before, after=after, change_pct=change)


def _per(basis: Basis) -> str:
    return "iteration" if basis == "per_iteration" else "s"


def _totals(before: Side, after: Side, basis: Basis, norm) -> list[tuple[str, str, float, float]]:
    per = _per(basis)
    rows = []
    if basis == "per_iteration":
        rows.append(("step time", "ns", round(before.step_mean_ns, 1), round(after.step_mean_ns, 1)))
    for label, share in (("compute share", "compute_pct"), ("copy share", "transfer_pct"),
                         ("communication share", "communication_pct"), ("idle share", "idle_pct")):
        rows.append((label, SHARE_UNIT, getattr(before.classification, share),
                     getattr(after.classification, share)))

    def both(label: str, unit: str, of) -> None:
        rows.append((label, f"{unit}/{per}", norm(before, of(before)), norm(after, of(after))))

    both("GPU busy", "ns", lambda s: s.busy_ns)
    both("GPU idle", "ns", lambda s: (s.window.duration_ns * len(s.devices) - s.busy_ns) if s.window else 0)
    both("kernel time", "ns", lambda s: sum(d.kernel_ns for d in s.devices))
    both("NCCL exposed", "ns", lambda s: sum(d.nccl_exposed_ns for d in s.devices))
    for direction in sorted({c.direction for c in before.copies + after.copies}):
        both(f"copy {direction}", "ns", lambda s, d=direction: sum(c.time_ns for c in s.copies if c.direction == d))
    both("pageable copies", "copies", lambda s: sum(c.pageable_count for c in s.copies))
    both("sync blocked", "ns", lambda s: s.sync_blocked_ns)
    both("sync calls", "calls", lambda s: s.sync_calls)
    both("launch API", "ns", lambda s: sum(d.launch_api_ns for d in s.devices))
    both("tiny kernels", "kernels", lambda s: sum(d.tiny_kernels for d in s.devices))
    return rows


DEVICE_FIGURES = (("GPU busy", "busy_ns", "ns"), ("kernel time", "kernel_ns", "ns"),
                  ("NCCL exposed", "nccl_exposed_ns", "ns"), ("launch API", "launch_api_ns", "ns"),
                  ("tiny kernels", "tiny_kernels", "kernels"))


def _per_device(before: Side, after: Side, basis: Basis, norm) -> list[tuple[str, int, str, float, float]]:
    by_b = {d.device: d for d in before.devices}
    by_a = {d.device: d for d in after.devices}
    rows = []
    for device in sorted(by_b.keys() & by_a.keys()):
        for label, key, unit in DEVICE_FIGURES:
            rows.append((label, device, f"{unit}/{_per(basis)}", norm(before, getattr(by_b[device], key)),
                         norm(after, getattr(by_a[device], key))))
    return rows


def _kernels(before: Side, after: Side, norm) -> list[KernelChange]:
    b = {k.name: k for k in before.kernels}
    a = {k.name: k for k in after.kernels}
    out = []
    for name in b.keys() | a.keys():
        tb = norm(before, b[name].total_ns) if name in b else 0.0
        ta = norm(after, a[name].total_ns) if name in a else 0.0
        status: Status = ("new" if name not in b else "gone" if name not in a else
                          "same" if abs(ta - tb) <= KERNEL_CHANGE_PCT / 100 * tb else "slower" if ta > tb else "faster")
        out.append(KernelChange(name=name, status=status, before_ns=tb, after_ns=ta,
                                before_count=norm(before, b[name].count) if name in b else 0.0,
                                after_count=norm(after, a[name].count) if name in a else 0.0,
                                change_ns=round(ta - tb, 1)))
    return sorted(out, key=lambda k: (-abs(k.change_ns), k.name))


def _findings(before: Side, after: Side, norm) -> list[FindingChange]:
    def by_cause(side: Side) -> dict[str, tuple[float, str]]:
        out: dict[str, tuple[float, str]] = {}
        for f in sorted(side.findings, key=lambda f: f.time_at_stake_ns):  # the costliest's title wins
            out[f.root_cause] = (out.get(f.root_cause, (0.0, ""))[0] + f.time_at_stake_ns, f.title)
        return {cause: (norm(side, ns), title) for cause, (ns, title) in out.items()}

    b, a = by_cause(before), by_cause(after)
    out = []
    for cause in b.keys() | a.keys():
        tb, ta = b.get(cause, (0.0, ""))[0], a.get(cause, (0.0, ""))[0]
        status: FindingStatus = ("new" if cause not in b else "gone" if cause not in a else
                                 "same" if abs(ta - tb) <= FINDING_CHANGE_PCT / 100 * tb else
                                 "bigger" if ta > tb else "smaller")
        out.append(FindingChange(root_cause=cause, status=status, before_ns=tb, after_ns=ta,
                                 title=(a.get(cause) or b[cause])[1]))
    return sorted(out, key=lambda f: (-abs(f.after_ns - f.before_ns), f.root_cause))


def _length(side: SideSummary) -> str:
    return ms(side.window.duration_ns) if side.window else "none"


def _change(row: FigureRow) -> str:
    if row.change_pct is None:
        return ""
    return f" ({row.change_pct:+.1f} {'points' if row.unit == SHARE_UNIT else '%'})".replace(" %", "%")


def shown(value: float, unit: str) -> str:
    """A figure's value for a reader: ns as ms, counts and shares as they are."""
    return ms(value) if unit.startswith("ns") else f"{value:,.1f}"


def render(result: Result) -> str:
    d = result.decision
    lines = [f"verdict: {d.verdict}: {d.reason}", *[f"warning: {w}" for w in d.warnings]]
    for label, s in (("before", result.before), ("after", result.after)):
        lines.append(f"{label}: {s.profile}, {s.program}, {len(s.gpus)} GPU(s), {s.bound}; window {_length(s)}, "
                     f"{s.window_note}")
    lines += ["", f"figures {result.basis.replace('_', ' ')} (before -> after):"]
    lines += [f"  {r.figure:20} {shown(r.before, r.unit)} -> {shown(r.after, r.unit)}{_change(r)}"
              for r in result.figures]
    devices = sorted({r.device for r in result.devices})
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
    lines = ["## nsightful diff", "", f"**{d.verdict}**: {d.reason}", ""]
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
