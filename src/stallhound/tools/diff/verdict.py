"""The verdict of a profile diff (improved / regressed / no clear change) and whether the two runs compare at all.

With steady iterations on both sides the verdict compares the mean step time. Its threshold is the larger of a
floor and NOISE_SIGMAS standard errors of the difference of the two means, from each side's iteration spread:
a change inside it could be chance. Without iterations on both sides a step cannot be timed, so the verdict
compares the GPU idle share of the window (the time a fix of the host side gives back), in percentage points.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from stallhound.tools.diff.side import Side

MIN_STEP_CHANGE_PCT = 2.0  # run-to-run drift (clocks, thermals, other tenants) that one run's spread does not show
NOISE_SIGMAS = 2.0  # standard errors: a normal-ish mean moves this far by chance about 1 run in 20
MIN_IDLE_CHANGE_POINTS = 5.0  # idle share moves a few points between two captures of the same program
WINDOW_RATIO_MAX = 3.0  # windows this many times apart see different slices of a run (warmup, periodic events)
SHARED_KERNEL_MIN_PCT = 50.0  # less of the kernel time in names both sides run: not the same program
EMPTY_BOUNDS = ("no GPU activity", "too little GPU activity")

Verdict = Literal["improved", "regressed", "no clear change"]
Basis = Literal["per_iteration", "per_second"]


class Decision(BaseModel):
    verdict: Verdict
    basis: Basis = Field(description="per_iteration: figures per steady iteration (both sides have them); "
                                     "per_second: per second of the analysed window")
    figure: str = Field(description="what the verdict compares")
    before: float | None
    after: float | None
    change_pct: float | None = Field(description="after vs before, % of before (points for the idle share)")
    threshold_pct: float = Field(description="a change must exceed this to count (points for the idle share)")
    noise_before_pct: float | None = Field(description="std / mean of the before side's steady iterations, %")
    noise_after_pct: float | None = Field(description="the same for the after side, %")
    reason: str
    warnings: list[str] = Field(description="why the two runs may not be comparable; empty when they are")


def basis_of(before: Side, after: Side) -> Basis:
    return "per_iteration" if before.iterations and after.iterations else "per_second"


def decide(before: Side, after: Side) -> Decision:
    warnings = comparability(before, after)
    basis = basis_of(before, after)
    if any(s.classification.bound in EMPTY_BOUNDS for s in (before, after)):
        return Decision(verdict="no clear change", basis=basis, figure="none", before=None, after=None,
                        change_pct=None, threshold_pct=0, noise_before_pct=None, noise_after_pct=None,
                        reason="a side has too little GPU activity to compare", warnings=warnings)
    if basis == "per_iteration":
        return _by_step(before, after, warnings)
    return _by_idle(before, after, warnings)


def _noise(side: Side) -> float:
    mean, std = side.step_ns
    return 100 * std / mean


def _by_step(before: Side, after: Side, warnings: list[str]) -> Decision:
    (b, b_std), (a, a_std) = before.step_ns, after.step_ns
    error = math.sqrt(b_std ** 2 / before.iterations + a_std ** 2 / after.iterations)
    threshold = round(max(MIN_STEP_CHANGE_PCT, 100 * NOISE_SIGMAS * error / b), 2)
    change = round(100 * (a - b) / b, 2)
    verdict: Verdict = "no clear change" if abs(change) <= threshold else "improved" if change < 0 else "regressed"
    reason = (f"mean step {b / 1e6:,.3f} ms -> {a / 1e6:,.3f} ms ({change:+.1f}%) over {before.iterations} and "
              f"{after.iterations} steady iterations; a change counts above {threshold:.1f}% (the larger of "
              f"{MIN_STEP_CHANGE_PCT:.0f}% and {NOISE_SIGMAS:.0f} standard errors of the difference, from spreads "
              f"of {_noise(before):.1f}% and {_noise(after):.1f}%)")
    return Decision(verdict=verdict, basis="per_iteration", figure="mean step time, ns", before=b, after=a,
                    change_pct=change, threshold_pct=threshold, noise_before_pct=round(_noise(before), 2),
                    noise_after_pct=round(_noise(after), 2), reason=reason, warnings=warnings)


def _by_idle(before: Side, after: Side, warnings: list[str]) -> Decision:
    b, a = before.classification.idle_pct, after.classification.idle_pct
    change = round(a - b, 2)
    verdict: Verdict = ("no clear change" if abs(change) <= MIN_IDLE_CHANGE_POINTS
                        else "improved" if change < 0 else "regressed")
    missing = " and ".join(s.profile for s in (before, after) if not s.iterations)
    reason = (f"no steady iterations in {missing}, so no step to time: GPU idle {b:.1f}% -> {a:.1f}% of the window "
              f"({change:+.1f} points; a change counts above {MIN_IDLE_CHANGE_POINTS:.0f} points)")
    return Decision(verdict=verdict, basis="per_second", figure="GPU idle share of the window, %", before=b, after=a,
                    change_pct=change, threshold_pct=MIN_IDLE_CHANGE_POINTS, noise_before_pct=None,
                    noise_after_pct=None, reason=reason, warnings=warnings)


def comparability(before: Side, after: Side) -> list[str]:
    """Why the two runs may not measure the same thing; empty when nothing says so."""
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
    if len(lengths) == 2 and max(lengths) > WINDOW_RATIO_MAX * min(lengths):
        out.append(f"windows of very different length ({lengths[0] / 1e6:,.1f} ms vs {lengths[1] / 1e6:,.1f} ms): "
                   "capture the same steps on both sides")
    return out


def _shared_kernel_pct(before: Side, after: Side) -> float | None:
    """Share of both sides' kernel time spent in kernel names that both sides run."""
    names_b = {k.name for k in before.kernels}
    names_a = {k.name for k in after.kernels}
    total = sum(k.total_ns for k in before.kernels + after.kernels)
    if not total:
        return None
    common = sum(k.total_ns for k in before.kernels + after.kernels if k.name in names_b & names_a)
    return 100 * common / total
