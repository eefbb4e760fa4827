"""The rows of a profile diff: figures in total and per device, kernels and findings, each side's figures divided
by the same unit (steady iterations; nothing, when both ran the same work without them; or seconds of window:
verdict.basis_of), with their change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from stallhound.analysis.common import ms
from stallhound.analysis.kernel_kinds import display_names
from stallhound.tools.diff.side import Side
from stallhound.tools.diff.verdict import Basis

KERNEL_CHANGE_PCT = 5.0  # a kernel's time per unit moving less than this is jitter (synth kernels jitter +-4%)
FINDING_CHANGE_PCT = 10.0  # time at stake moving less than this is the same finding, measured again
SHARE_UNIT = "% of window"

Status = Literal["slower", "faster", "new", "gone", "same"]
FindingStatus = Literal["gone", "new", "smaller", "bigger", "same"]


Norm = Callable[[Side, float], float]  # one side's figure divided by its unit


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
    before_ns: float = Field(description="time of the kernels the window launched, per unit of `basis`")
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


def figure_row(figure: str, device: int | None, unit: str, before: float, after: float) -> FigureRow:
    if unit == SHARE_UNIT:
        return FigureRow(figure=figure, device=device, unit=unit, before=before, after=after,
                         change_pct=round(after - before, 2))
    change = round(100 * (after - before) / before, 2) if before else None
    return FigureRow(figure=figure, device=device, unit=unit, before=before, after=after, change_pct=change)


def unit_of(unit: str, basis: Basis) -> str:
    """A figure's unit on the basis: per iteration, per second, or as it is (a total of the same work)."""
    return {"per_iteration": f"{unit}/iteration", "per_second": f"{unit}/s", "per_run": unit}[basis]


def total_figures(before: Side, after: Side, basis: Basis, norm: Norm) -> list[tuple[str, str, float, float]]:
    rows = []
    if basis == "per_iteration":
        rows.append(("step time", "ns", round(before.step_ns[0], 1), round(after.step_ns[0], 1)))
    for label, share in (("compute share", "compute_pct"), ("copy share", "transfer_pct"),
                         ("communication share", "communication_pct"), ("idle share", "idle_pct")):
        rows.append((label, SHARE_UNIT, getattr(before.classification, share),
                     getattr(after.classification, share)))

    def both(label: str, unit: str, of) -> None:
        rows.append((label, unit_of(unit, basis), norm(before, of(before)), norm(after, of(after))))

    both("GPU-active span", "ns", lambda s: s.work.span_ns)
    if before.work.host_ns is not None and after.work.host_ns is not None:
        both("host time", "ns", lambda s: s.work.host_ns)
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


def device_figures(before: Side, after: Side, basis: Basis, norm: Norm) -> list[tuple[str, int, str, float, float]]:
    by_b = {d.device: d for d in before.devices}
    by_a = {d.device: d for d in after.devices}
    rows = []
    for device in sorted(by_b.keys() & by_a.keys()):
        for label, key, unit in DEVICE_FIGURES:
            rows.append((label, device, unit_of(unit, basis), norm(before, getattr(by_b[device], key)),
                         norm(after, getattr(by_a[device], key))))
    return rows


def _labels(before: Side, after: Side) -> dict[str, str]:
    """Display names of the kernels of both sides, told apart across both (top_kernels' display names)."""
    variants: dict[str, set[str]] = {}
    for k in before.kernels + after.kernels:
        variants.setdefault(k.short_name, set()).add(k.name)
    return {name: label for short, names in variants.items() for name, label in display_names(short, names).items()}


def kernel_changes(before: Side, after: Side, norm: Norm) -> list[KernelChange]:
    """The kernels the two windows launched, matched by demangled name, shown by display name."""
    b = {k.name: k for k in before.kernels}
    a = {k.name: k for k in after.kernels}
    labels = _labels(before, after)
    out = []
    for name in b.keys() | a.keys():
        tb = norm(before, b[name].total_ns) if name in b else 0.0
        ta = norm(after, a[name].total_ns) if name in a else 0.0
        status: Status = ("new" if name not in b else "gone" if name not in a else
                          "same" if abs(ta - tb) <= KERNEL_CHANGE_PCT / 100 * tb else "slower" if ta > tb else "faster")
        out.append(KernelChange(name=labels[name], status=status, before_ns=tb, after_ns=ta,
                                before_count=norm(before, b[name].count) if name in b else 0.0,
                                after_count=norm(after, a[name].count) if name in a else 0.0,
                                change_ns=round(ta - tb, 1)))
    return sorted(out, key=lambda k: (-abs(k.change_ns), k.name))


def finding_changes(before: Side, after: Side, norm: Norm) -> list[FindingChange]:
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


def shown(value: float, unit: str) -> str:
    """A figure's value for a reader: ns as ms, counts and shares as they are."""
    return ms(value) if unit.startswith("ns") else f"{value:,.1f}"
