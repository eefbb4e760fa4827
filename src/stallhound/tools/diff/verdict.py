"""The verdict of a profile diff (improved / regressed / no clear change), the figure that decided it, and whether the
two runs compare at all.

The two runs did the same work when they are the same program and their kernels match by name with launch counts
within LAUNCH_TOLERANCE_PCT (per steady iteration when both sides have steps found the same way, else over the
window; the work is what each window launched, tools/diff/work.py). Steps found the same way: by the same NVTX
range, or the same kernel's rhythm; steps found from different kernels measure different things (a kernel that runs
twice a step has twice the rhythm), so they are no unit to compare by. Then the time that work took is compared as
it is, never per second: first the elapsed time (the median step when both sides have such steps, else the
GPU-active span of the work), and when that does not move beyond its threshold, the kernel time and the host's own
time issuing the work, each against its own floor: slower kernels under a host-bound loop, or a slower host under a
GPU-bound one, still count. The step time is the median of the steady iterations (a warmup or profiler-stop step moves
it little), and its threshold the larger of a floor and NOISE_SIGMAS standard errors of the difference of the two
medians, from each side's robust spread (tools/diff/side.py): a change inside it could be chance.

When the work differs, a time is not comparable as it is. With such steps on both sides the step is the unit of work
(a fix that fuses kernels or changes their dtype changes the kernels, not the step), compared by step time alone.
Without them only rates compare: the GPU idle share of the window, in percentage points, and only when the GPU ran as
much work per second. When both ran the same kernels (SAME_KERNELS_PCT of each side's launches in names both launch)
at launch rates (launches per second of the window) more than WORK_RATE_CHANGE_PCT apart, one side ran more of the
same work in each second (the same kernels run twice, more iterations packed into the window): a busier GPU is that
work, not the same work done faster, so the verdict is 'no clear change', decided by the launch rate, and says so.
Either way the result says that the work differs.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from stallhound.tools.diff.side import Side

MIN_STEP_CHANGE_PCT = 2.0  # run-to-run drift (clocks, thermals, other tenants) that one run's spread does not show
NOISE_SIGMAS = 2.0  # standard errors: a normal-ish median moves this far by chance about 1 run in 20
MEDIAN_SE_PER_MEAN_SE = math.sqrt(math.pi / 2)  # a median's standard error per a mean's (normal samples)
MIN_IDLE_CHANGE_POINTS = 5.0  # idle share moves a few points between two captures of the same program
# Launches left unmatched by kernel name, of the larger side's: a capture's edge cuts a launch or two, and a fix may
# add or drop a small kernel (sync_pageable_fixed sums its loss on the device: 1 launch more in 45 a step); doubled
# work leaves half of its launches unmatched.
LAUNCH_TOLERANCE_PCT = 5.0
KERNEL_TIME_CHANGE_PCT = 5.0  # the same launches of the same kernels: clocks and thermals move their total a few %
HOST_TIME_CHANGE_PCT = 10.0  # the host's own time moves more between runs (scheduling, allocator, interpreter)
WINDOW_RATIO_MAX = 3.0  # windows this many times apart see different slices of a run (warmup, periodic events)
SHARED_KERNEL_MIN_PCT = 50.0  # less of the kernel time in names both sides run: not the same program
SAME_KERNELS_PCT = 95.0  # launches in kernel names both sides launch: the same kernels, in whatever numbers
WORK_RATE_CHANGE_PCT = 25.0  # launches per second of the window: a window's edges and jitter move it a few %; the
#                              same work run twice in a host-paced loop moves it by far more
EMPTY_BOUNDS = ("no GPU activity", "too little GPU activity")

Verdict = Literal["improved", "regressed", "no clear change"]
Basis = Literal["per_iteration", "per_run", "per_second"]
Figure = Literal["step_time_ns", "gpu_active_span_ns", "kernel_time_ns", "host_time_ns", "idle_share_pct",
                 "launches_per_s", "none"]
LABELS = {"step_time_ns": "median step", "gpu_active_span_ns": "GPU-active span of the work",
          "kernel_time_ns": "kernel time", "host_time_ns": "host time issuing the work"}


class Compared(BaseModel):
    figure: Figure = Field(description="what was compared, units in the name")
    before: float
    after: float
    change_pct: float = Field(description="after vs before, % of before")
    threshold_pct: float = Field(description="a change must exceed this to count")


class WorkMatch(NamedTuple):
    same: bool
    matched_pct: float | None
    note: str


class Decision(BaseModel):
    verdict: Verdict
    basis: Basis = Field(description="per_iteration: figures per steady iteration (both sides have them, found the "
                                     "same way); per_run: totals of the window (both sides ran the same work, "
                                     "without such steps); per_second: per second of the window (the work differs)")
    same_work: bool = Field(description="both runs are the same program and launched the same kernels, launch "
                                        f"counts matched by name within {LAUNCH_TOLERANCE_PCT:g}%")
    matched_launches_pct: float | None = Field(description="launches matched by kernel name, % of the larger side's "
                                                           "(per iteration on the per_iteration basis)")
    work_note: str = Field(description="how the two runs' work compares")
    figure: Figure = Field(description="the figure that decided the verdict, units in its name")
    before: float | None
    after: float | None
    change_pct: float | None = Field(description="after vs before, % of before (points for idle_share_pct)")
    threshold_pct: float = Field(description="a change must exceed this to count (points for idle_share_pct)")
    noise_before_pct: float | None = Field(description="robust spread / median of the before side's steady "
                                                       "iterations, %")
    noise_after_pct: float | None = Field(description="the same for the after side, %")
    compared: list[Compared] = Field(description="the times of the work compared, in the order they decide: the "
                                                 "elapsed time, then kernel and host time (the same work only)")
    reason: str
    warnings: list[str] = Field(description="why the two runs may not be comparable; empty when they are")


def steps_compare(before: Side, after: Side) -> bool:
    """Both sides have steady iterations, found the same way: the step is a unit both share."""
    return bool(before.iterations and after.iterations and before.step_method == after.step_method)


def work_match(before: Side, after: Side) -> WorkMatch:
    """Whether the two sides ran the same work: the same program, launches matched by kernel name."""
    steps = steps_compare(before, after)
    per = "per iteration" if steps else "in the window"
    b, a = ({k: n / (s.iterations if steps else 1) for k, n in s.work.launches_by_name().items()}
            for s in (before, after))
    total = max(sum(b.values()), sum(a.values()))
    if before.program != after.program:
        return WorkMatch(False, None, f"not the same work: different programs ({before.program} vs {after.program})")
    if not total:
        return WorkMatch(False, None, "not the same work: no kernel launches to match")
    pct = round(100 * sum(min(n, a.get(k, 0.0)) for k, n in b.items()) / total, 2)
    counts = f"{sum(b.values()):,.1f} and {sum(a.values()):,.1f} launches {per}"
    if pct >= 100 - LAUNCH_TOLERANCE_PCT:
        return WorkMatch(True, pct, f"the same work ({pct:.1f}% of {counts} match by kernel name)")
    return WorkMatch(False, pct, f"not the same work: {pct:.1f}% of {counts} match by kernel name (the same work "
                                 f"matches {100 - LAUNCH_TOLERANCE_PCT:g}% or more)")


def basis_of(before: Side, after: Side) -> Basis:
    if steps_compare(before, after):
        return "per_iteration"
    return "per_run" if work_match(before, after).same else "per_second"


def decide(before: Side, after: Side) -> Decision:
    match = work_match(before, after)
    warnings = comparability(before, after, match.same)
    basis = basis_of(before, after)
    if any(s.classification.bound in EMPTY_BOUNDS for s in (before, after)):
        return Decision(verdict="no clear change", basis=basis, same_work=match.same,
                        matched_launches_pct=match.matched_pct, work_note=match.note, figure="none", before=None,
                        after=None, change_pct=None, threshold_pct=0, noise_before_pct=None, noise_after_pct=None,
                        compared=[], reason=f"a side has too little GPU activity to compare; {match.note}",
                        warnings=warnings)
    if basis == "per_second":
        return _by_work_rate(before, after, match, warnings) or _by_idle(before, after, match, warnings)
    return _by_work(before, after, basis, match, warnings)


def _noise(side: Side) -> float:
    median, sigma = side.step_ns
    return 100 * sigma / median


def _change(before: float, after: float) -> float:
    return round(100 * (after - before) / before, 2) if before else (0.0 if not after else 100.0)


def _elapsed(before: Side, after: Side, basis: Basis) -> Compared:
    """The median step with its noise threshold, or the GPU-active span of the work over the drift floor."""
    if basis == "per_iteration":
        (b, b_sigma), (a, a_sigma) = before.step_ns, after.step_ns
        error = MEDIAN_SE_PER_MEAN_SE * math.sqrt(b_sigma ** 2 / before.iterations + a_sigma ** 2 / after.iterations)
        threshold = round(max(MIN_STEP_CHANGE_PCT, 100 * NOISE_SIGMAS * error / b), 2)
        return Compared(figure="step_time_ns", before=b, after=a, change_pct=_change(b, a), threshold_pct=threshold)
    b, a = before.work.span_ns, after.work.span_ns
    return Compared(figure="gpu_active_span_ns", before=b, after=a, change_pct=_change(b, a),
                    threshold_pct=MIN_STEP_CHANGE_PCT)


def _parts(before: Side, after: Side, basis: Basis) -> list[Compared]:
    """Kernel time and the host's own time of the work, per iteration or in total; host time only where both
    sides recorded their launch calls."""
    per = (before.iterations, after.iterations) if basis == "per_iteration" else (1, 1)
    b, a = (sum(k.total_ns for k in s.kernels) / n for s, n in zip((before, after), per, strict=True))
    out = [Compared(figure="kernel_time_ns", before=b, after=a, change_pct=_change(b, a),
                    threshold_pct=KERNEL_TIME_CHANGE_PCT)]
    if before.work.host_ns is not None and after.work.host_ns is not None:
        b, a = before.work.host_ns / per[0], after.work.host_ns / per[1]
        out.append(Compared(figure="host_time_ns", before=b, after=a, change_pct=_change(b, a),
                            threshold_pct=HOST_TIME_CHANGE_PCT))
    return out


def _said(c: Compared) -> str:
    return f"{LABELS[c.figure]} {c.before / 1e6:,.3f} ms -> {c.after / 1e6:,.3f} ms ({c.change_pct:+.1f}%)"


def _moved(c: Compared) -> bool:
    return abs(c.change_pct) > c.threshold_pct


def _by_work(before: Side, after: Side, basis: Basis, match: WorkMatch, warnings: list[str]) -> Decision:
    """The elapsed time decides when it moved; else the kernel or host time that moved most (the same work only)."""
    elapsed = _elapsed(before, after, basis)
    compared = [elapsed, *_parts(before, after, basis)] if match.same else [elapsed]
    moved = [c for c in compared[1:] if _moved(c)]
    decider = elapsed if _moved(elapsed) or not moved else max(moved, key=lambda c: abs(c.change_pct))
    verdict: Verdict = ("no clear change" if not _moved(decider) else
                        "improved" if decider.change_pct < 0 else "regressed")
    steps = basis == "per_iteration"
    reason = _reason(before, after, match, decider, elapsed)
    return Decision(verdict=verdict, basis=basis, same_work=match.same, matched_launches_pct=match.matched_pct,
                    work_note=match.note, figure=decider.figure, before=decider.before, after=decider.after,
                    change_pct=decider.change_pct, threshold_pct=decider.threshold_pct,
                    noise_before_pct=round(_noise(before), 2) if steps else None,
                    noise_after_pct=round(_noise(after), 2) if steps else None, compared=compared, reason=reason,
                    warnings=warnings)


def _reason(before: Side, after: Side, match: WorkMatch, decider: Compared, elapsed: Compared) -> str:
    step = decider.figure == "step_time_ns"
    unit = f" over {before.iterations} and {after.iterations} steady iterations" if step else ""
    noise = (f": the larger of {MIN_STEP_CHANGE_PCT:.0f}% and {NOISE_SIGMAS:.0f} standard errors of the difference, "
             f"from spreads of {_noise(before):.1f}% and {_noise(after):.1f}%") if step else ""
    reason = (f"{match.note}{'' if match.same else ', the step compared as the unit of work'}: {_said(decider)}{unit} "
              f"(a change counts above {decider.threshold_pct:.1f}%{noise})")
    if decider is not elapsed:
        reason += f"; the {_said(elapsed)}, within its {elapsed.threshold_pct:.1f}%"
    return reason


def _by_idle(before: Side, after: Side, match: WorkMatch, warnings: list[str]) -> Decision:
    b, a = before.classification.idle_pct, after.classification.idle_pct
    change = round(a - b, 2)
    verdict: Verdict = ("no clear change" if abs(change) <= MIN_IDLE_CHANGE_POINTS
                        else "improved" if change < 0 else "regressed")
    missing = " and ".join(s.profile for s in (before, after) if not s.iterations)
    steps = (f"no steady iterations in {missing}" if missing else
             f"steps found differently ({before.step_method} and {after.step_method})")
    reason = (f"{match.note}, and {steps} to take as the unit of work, so their times "
              f"are not comparable and only rates are: GPU idle {b:.1f}% -> {a:.1f}% of the window ({change:+.1f} "
              f"points; a change counts above {MIN_IDLE_CHANGE_POINTS:.0f} points)")
    return Decision(verdict=verdict, basis="per_second", same_work=False, matched_launches_pct=match.matched_pct,
                    work_note=match.note, figure="idle_share_pct", before=b, after=a, change_pct=change,
                    threshold_pct=MIN_IDLE_CHANGE_POINTS, noise_before_pct=None, noise_after_pct=None, compared=[],
                    reason=reason, warnings=warnings)


def _launch_rates(before: Side, after: Side) -> tuple[float, float] | None:
    """Launches per second of each side's window, when both launched the same kernels (whatever their numbers)."""
    counts = [s.work.launches_by_name() for s in (before, after)]
    shared = set(counts[0]) & set(counts[1])
    if not all(c and sum(c[k] for k in shared) >= SAME_KERNELS_PCT / 100 * sum(c.values()) for c in counts):
        return None
    lengths = [s.window.duration_ns if s.window else 0 for s in (before, after)]
    if not all(lengths):
        return None
    return 1e9 * sum(counts[0].values()) / lengths[0], 1e9 * sum(counts[1].values()) / lengths[1]


def _by_work_rate(before: Side, after: Side, match: WorkMatch, warnings: list[str]) -> Decision | None:
    """'no clear change' decided by the launch rate when the same kernels ran at rates far apart: one side ran more of
    the same work each second, which its idle share and times measure; None when the rates are close."""
    rates = _launch_rates(before, after)
    if rates is None or abs(_change(*rates)) <= WORK_RATE_CHANGE_PCT:
        return None
    b, a = rates
    more = "more" if a > b else "less"
    idle = (before.classification.idle_pct, after.classification.idle_pct)
    reason = (f"{more} work: the same kernels launched {a / b:.2f}x as often per second of the window ({b:,.0f} -> "
              f"{a:,.0f} launches/s, {_change(b, a):+.1f}%; a change counts above {WORK_RATE_CHANGE_PCT:.0f}%); "
              f"{match.note}. The GPU idle share ({idle[0]:.1f}% -> {idle[1]:.1f}%) and the times measure that work, "
              "not the same work done faster or slower: capture the same steps on both sides, or mark each step with "
              "an NVTX range, to compare them")
    return Decision(verdict="no clear change", basis="per_second", same_work=False,
                    matched_launches_pct=match.matched_pct, work_note=match.note, figure="launches_per_s",
                    before=round(b, 1), after=round(a, 1), change_pct=_change(b, a),
                    threshold_pct=WORK_RATE_CHANGE_PCT, noise_before_pct=None, noise_after_pct=None, compared=[],
                    reason=reason, warnings=warnings)


def comparability(before: Side, after: Side, same_work: bool) -> list[str]:
    """Why the two runs may not measure the same thing; empty when nothing says so. Windows of very different
    length are no reason when both ran the same work: that work took very different times."""
    out = [f"the {label} profile ({s.profile}) has no GPU work to compare ({s.classification.bound})"
           for label, s in (("before", before), ("after", after)) if s.classification.bound in EMPTY_BOUNDS]
    named = [(b, a) for b, a in zip(before.gpus, after.gpus, strict=False) if "unknown" not in b + a]
    if len(before.gpus) != len(after.gpus) or any(b != a for b, a in named):
        out.append(f"different GPUs: {', '.join(before.gpus) or 'none'} vs {', '.join(after.gpus) or 'none'}")
    if before.program != after.program:
        out.append(f"different programs: {before.program} vs {after.program}")
    shared = _shared_kernel_pct(before, after)
    if shared is not None and shared < SHARED_KERNEL_MIN_PCT:
        out.append(f"different programs: only {shared:.0f}% of the kernel time is in kernels both runs launch")
    lengths = [s.window.duration_ns for s in (before, after) if s.window]
    if not same_work and len(lengths) == 2 and max(lengths) > WINDOW_RATIO_MAX * min(lengths):
        out.append(f"windows of very different length ({lengths[0] / 1e6:,.1f} ms vs {lengths[1] / 1e6:,.1f} ms): "
                   "capture the same steps on both sides")
    return out


def _shared_kernel_pct(before: Side, after: Side) -> float | None:
    """Share of both sides' kernel time spent in kernel names that both sides run."""
    kernels = before.kernels + after.kernels
    names = {k.name for k in before.kernels} & {k.name for k in after.kernels}
    total = sum(k.total_ns for k in kernels)
    if not total:
        return None
    return 100 * sum(k.total_ns for k in kernels if k.name in names) / total
