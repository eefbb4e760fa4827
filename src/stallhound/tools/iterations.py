"""How long is each training step, is the first one (warmup) much slower, and how busy are the GPUs in each?

Window: the capture unless start_ns/end_ns are given; only ranges and kernels lying inside it count.

Boundaries ('method'):
* 'nvtx:<name>'. Candidates are NVTX push/pop and start/end ranges. A text first loses PyTorch's
  record_function metadata (from ', seq = N', ', op_id = N', ', sizes = ...' to the end). Per-op ranges never
  mark a step: autograd functions (the raw text has 'seq = N'), operator namespaces (aten::, prim::, c10d::,
  flash_attn::, ...), library calls (cuBLAS, cuDNN, NCCL, ...), MPI calls, XLA thunks and source-line markers
  (PER_OP). A family is the texts equal apart from their digit runs (same kind and depth). When, on every
  thread in time order, the numbers of a family strictly increase (compared as a tuple), they count instances
  and the family is one range, named with N for each number ('iteration N'); otherwise each distinct text is
  a range of its own. A range qualifies on a thread where it occurs >= 3 times, at least half of them with
  GPU work: a kernel, memcpy or memset of a device in scope whose launch call starts inside it on that thread,
  or a CUDA graph launch (nsys may trace graphs whole, without kernel rows). Chosen: 'ProfilerStep#N' first,
  then names with step/iter/train/batch/forward, then the outermost (push/pop depth; start/end ranges count as
  depth 0), then the longest period (fewest ranges on a thread), then the earliest. `range_name` picks a range
  instead (per-op and GPU rules waived; letters compared, case and numbers ignored, an exact name first).
  A range that says it is one step (step or iter[ation] as a word: 'train_step', 'TrainStep', 'iteration N',
  'ProfilerStep#N') is the program's own marker and qualifies however few times it occurs, even once; torch.optim's
  'Optimizer.step#...' and autograd nodes ('ReluBackward0') are per-op ranges. Each iteration is its range's own
  span as the device lived it (duration_basis 'range'): it starts at the range's start, moved later to when the
  GPU work its thread launched earlier (or work queued before the trace recorded launches) ends, if that is later
  and no later than the range's own first GPU work on its main stream starts (the stream where its work holds the
  most GPU time: a host running ahead of a busy GPU enqueues step k+1 while step k runs, and may start step k+1's
  input copies on a side stream at once); a thread's first range moves only when the devices were busy through
  that wait at least 3/4 as much as through the range (a GPU stalled on a wait the trace does not explain leaves
  the stall in the step), a later one always (the time is the step before's). It ends at the range's end or the
  end of the last GPU work launched inside it, whichever is later, and no later than the thread's next range
  starts on the device: steps of one thread never overlap (work that runs on into the next step, as a side
  stream's copy, counts in the next). Time between ranges belongs to no iteration. The last range counts only
  when it lasts at least half the median of the others (else it is a step cut off by the window) or is the only one.
  Threads combine by index: iteration k runs from the median over the threads that have a k-th range of their
  k-th starts to the median of their k-th ends (a straggling rank does not move it).
* 'graph:<launch call>' (no qualifying NVTX range): CUDA graph replays. A replay is the kernels one graph launch
  ran (sharing its correlation id; Kineto, nsys' node-level trace) or one graph_exec row (nsys' whole-graph trace),
  all of it inside the window. On each launching thread whose replays hold at least half of its device's GPU time
  (kernels, graph executions, copies and memsets, summed), each replay starts a step: iteration k runs from replay
  k's GPU start to replay k+1's (the eager work after a replay is its step's; duration_basis 'start_to_start'), the
  last to its own end (kept as a last range is, above); threads combine by index as above. One replay is one step.
  A repeating range comes first: it encloses a graph replayed several times a step; a replay comes before a kernel
  rhythm, which only samples it (one layer's kernel runs many times a replay). Replays of graphs that hold less (one
  layer captured, a piece between eager ops) mark no step.
* 'kernel_pattern:<kernel>' (no qualifying NVTX range or graph replays): on the first device in scope with
  kernels, a kernel name marks steps when it runs >= 3 times, its first to last start covers at least half the
  device's first to last kernel, at least 75% of its periods (start to next start) lie within 25% of their median,
  and those fill at least a quarter of the time after its first period. The coarsest such rhythm wins (fewest runs, then
  the one that runs first, so boundaries fall on a step's first kernel); iteration k runs from its k-th start
  to its (k+1)-th (duration_basis 'start_to_start').
gpu_busy_pct: per device in scope, the union of its kernel, memcpy and memset intervals inside the iteration
(busy as gpu_utilization counts it), summed over the devices / (duration x devices). steady_median_ns = median
duration of iterations 1..n-1; first_vs_steady = first / steady median; spread_ratio = p90 / p10 of all
durations; steady_spread_ratio the same without the first when it is the warmup outlier (above 1.5x the steady
median with 3+ iterations); outliers: later iterations above 2x the steady median (data only: their cause is not
decided here).
Times in ns.
"""

from __future__ import annotations

import re
import statistics
from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    OffsetParam,
    Paged,
    Scope,
    ScopedParams,
    more_rows,
    ms,
    next_page,
    pct,
    resolve_scope,
)
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.span_busy import busy_ns
from stallhound.analysis.step_boundaries import (
    MAX_CANDIDATES,
    PROFILER_STEP,
    STEP_NAMES,
    Candidate,
    Spans,
    boundaries,
    duration_basis,
    own_unit,
    steady_median_ns,
)
from stallhound.formats.remedy import remedy

MIN_ITERATIONS = 3  # a first iteration plus two to take a steady median from
WARMUP_RATIO = 1.5  # first iteration this much slower than steady state: the window includes warmup
WARMUP_HIGH_RATIO = 10.0  # book profiler-window-on-warmup: 10-100x is typical of a capture from launch
MIN_WARMUP_SHARE = 0.01  # warmup excess below 1% of the iterations' span skews no window-wide figure by more
IRREGULAR_SPREAD = 3.0  # p90/p10 of durations above this: the boundaries do not time one repeating step
OUTLIER_RATIO = 2.0  # a later iteration twice the steady median is an isolated slow step
MAX_OUTLIERS = 3  # outliers listed, slowest first
BUSY_BUCKETS = 16  # overlap-join buckets per typical iteration
TRIAGE = TriageRole("warmup", order=1)  # triage's window is the steady state it finds
RANGE_NAME = ("NVTX range marking one iteration, e.g. 'iteration N' or 'train_step' (letters compared, case and "
              "numbers ignored); omit to auto-detect")  # the step override, worded alike in every tool that takes it


class Params(ScopedParams):
    range_name: Annotated[str | None, Field(description=RANGE_NAME)] = None
    method: Annotated[Literal["auto", "nvtx", "graph", "kernel_pattern"], Field(
        description="auto: NVTX when a range qualifies, else CUDA graph replays, else the kernel pattern")] = "auto"
    limit: LimitParam = DEFAULT_LIMIT
    offset: OffsetParam = 0


class IterationRow(BaseModel):
    index: int = Field(description="0-based, in time order")
    start_ns: int
    end_ns: int
    duration_ns: int
    gpu_busy_pct: float


class Outlier(BaseModel):
    index: int
    duration_ns: int
    vs_steady: float = Field(description="duration / steady_median_ns")


class Result(Paged):
    scope: Scope
    method: str | None = Field(description="'nvtx:<name>', 'graph:<launch call>' or 'kernel_pattern:<kernel>'; null "
                                           "when none found")
    duration_basis: Literal["range", "start_to_start"] | None = Field(
        description="'range': each iteration is its range's own span on the device (nvtx); 'start_to_start': from "
                    "one range's, graph replay's or marker kernel's start to the next (the last to its own end); "
                    "null when none found")
    reason: str | None = Field(description="why these boundaries: the range or kernel, its counts and the rule")
    candidates: list[Candidate] = Field(description=f"qualifying NVTX ranges, the chosen first, at most "
                                                    f"{MAX_CANDIDATES}; pass another's name as range_name")
    note: str | None = Field(description="set when there are no or too few iterations, and why")
    iteration_count: int
    span_start_ns: int | None = Field(None, description="start of the first iteration")
    span_end_ns: int | None = Field(None, description="end of the last iteration")
    first_ns: int | None = None
    steady_start_ns: int | None = Field(None, description="start of the first steady iteration: the second when "
                                                          "the first is the warmup outlier, else the first")
    steady_median_ns: float | None = Field(None, description="median duration of iterations 1..n-1")
    first_vs_steady: float | None = None
    mean_ns: float | None = None
    std_ns: float | None = None
    p10_ns: float | None = None
    p90_ns: float | None = None
    spread_ratio: float | None = Field(None, description="p90 / p10 of all iteration durations")
    steady_spread_ratio: float | None = Field(None, description="p90 / p10 of the steady iterations' durations "
                                                                "(without the first when it is the warmup outlier)")
    slowest_index: int | None = None
    slowest_ns: int | None = None
    outliers: list[Outlier] = Field([], description=f"later iterations above {OUTLIER_RATIO}x the steady median")
    rows: list[IterationRow] = Field(description="`limit` iterations from `offset`, in time order")
    truncated: bool
    total_rows: int
    findings: list[Finding] = []


def _deciles(values: list[int]) -> tuple[float, float, float]:
    """p10, median, p90 (linear interpolation, as numpy's default)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return cuts[0], cuts[4], cuts[8]


def _busy(con: duckdb.DuckDBPyConnection, scope: Scope, spans: Spans) -> list[float]:
    busy = busy_ns(con, scope.devices, spans, BUSY_BUCKETS)
    return [pct(b, (e - s) * len(scope.devices)) if scope.devices else 0.0 for b, (s, e) in zip(busy, spans,
                                                                                                strict=True)]


def _spread(durations: list[int]) -> float | None:
    p10, _, p90 = _deciles(durations)
    return round(p90 / p10, 3) if p10 else None


def _summary(spans: Spans) -> dict:
    durations = [e - s for s, e in spans]
    if not durations:
        return {}
    steady = steady_median_ns(durations)
    warmup = len(durations) >= MIN_ITERATIONS and steady is not None and durations[0] > WARMUP_RATIO * steady
    p10, _, p90 = _deciles(durations)
    slowest = max(range(len(durations)), key=lambda i: (durations[i], -i))
    slow = sorted((i for i in range(1, len(durations)) if steady and durations[i] > OUTLIER_RATIO * steady),
                  key=lambda i: (-durations[i], i))
    outliers = [Outlier(index=i, duration_ns=durations[i], vs_steady=round(durations[i] / steady, 3))
                for i in slow[:MAX_OUTLIERS]] if steady else []
    return {"outliers": outliers,
            "first_ns": durations[0], "steady_median_ns": steady,
            "first_vs_steady": round(durations[0] / steady, 3) if steady else None,
            "mean_ns": round(statistics.fmean(durations), 1), "std_ns": round(statistics.pstdev(durations), 1),
            "p10_ns": p10, "p90_ns": p90, "spread_ratio": round(p90 / p10, 3) if p10 else None,
            "steady_start_ns": spans[1][0] if warmup else spans[0][0],
            "steady_spread_ratio": _spread(durations[1:] if warmup else durations),
            "slowest_index": slowest, "slowest_ns": durations[slowest]}


def _judged_spread(method: str | None, spread: float | None, steady_spread: float | None) -> float | None:
    """The spread that says whether the boundaries time one repeating step: without a warmup first step only for
    the program's own markers (a slow first step is theirs; another rhythm's odd first period is no step)."""
    return steady_spread if own_unit(method) else spread


def _note(con: duckdb.DuckDBPyConnection, method: str | None, reason: str | None, count: int,
          spread: float | None) -> str | None:
    if method is None:
        return f"{reason}; annotate each step with an NVTX range (capture with {remedy(con, ('nvtx',), bare=True)})"
    if count < MIN_ITERATIONS:
        own = own_unit(method)
        whose = "graph replays" if method.startswith("graph:") else "step marker"
        return (f"only {count} {'step' if own else 'iteration'}(s) by {method}"
                + (f" (the program's own {whose}: triage analyses them)" if own else "")
                + f": too few to tell warmup from steady state (needs {MIN_ITERATIONS}); capture more steps")
    if spread is not None and spread > IRREGULAR_SPREAD:
        return (f"durations vary widely (p90/p10 = {spread}): these boundaries may not time one repeating step; "
                "check the candidates or pass range_name")
    return None


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    method, reason, candidates, spans = boundaries(con, scope, params.range_name, params.method)
    shown = spans[params.offset:params.offset + params.limit]
    busy = _busy(con, scope, shown)
    rows = [IterationRow(index=i, start_ns=s, end_ns=e, duration_ns=e - s, gpu_busy_pct=b)
            for i, ((s, e), b) in enumerate(zip(shown, busy, strict=True), start=params.offset)]
    more = len(spans) > params.offset + params.limit
    summary = _summary(spans)
    return Result(scope=scope, method=method, duration_basis=duration_basis(method),
                  reason=reason if method else None, candidates=candidates,
                  note=_note(con, method, reason, len(spans), _judged_spread(
                      method, summary.get("spread_ratio"), summary.get("steady_spread_ratio"))),
                  iteration_count=len(spans),
                  span_start_ns=spans[0][0] if spans else None, span_end_ns=spans[-1][1] if spans else None,
                  rows=rows, truncated=more, total_rows=len(spans), offset=params.offset,
                  next_offset=next_page(params.offset, len(rows), more), **summary)


def first_is_warmup(result: Result) -> bool:
    """The first iteration is a warmup outlier: slower than WARMUP_RATIO x steady, with enough iterations."""
    return (result.iteration_count >= MIN_ITERATIONS and result.first_vs_steady is not None
            and result.first_vs_steady > WARMUP_RATIO)


def steady_window(result: Result, irregular_ok: bool = False) -> tuple[int, int] | None:
    """(start_ns, end_ns) of steady state: from the first steady iteration (the second when the first is the
    warmup outlier) to the end of the last. The program's own steps (own_unit), however few, bound it (one
    ProfilerStep is the step the user chose to profile); other boundaries need MIN_ITERATIONS iterations. None
    when the iterations are irregular (the boundaries may not time a step) unless irregular_ok: for the program's
    own markers, irregular after a warmup first step; for other boundaries, over all of them."""
    spread = _judged_spread(result.method, result.spread_ratio, result.steady_spread_ratio)
    irregular = spread is not None and spread > IRREGULAR_SPREAD
    few = result.iteration_count < MIN_ITERATIONS
    if result.iteration_count == 0 or (few and not marked_steps(result)) or (irregular and not irregular_ok):
        return None
    start, end = result.steady_start_ns, result.span_end_ns
    assert start is not None and end is not None  # set whenever there is an iteration
    return start, end


def marked_steps(result: Result) -> bool:
    """The boundaries are ranges that say they are one step (torch.profiler's ProfilerStep#N, 'train_step',
    'iteration N') or the replays of the program's CUDA graph: the program's own steps."""
    return own_unit(result.method)


def step_named(result: Result) -> bool:
    """The boundaries come from a stable kernel rhythm, CUDA graph replays, torch.profiler's step range or a range
    named like a step: the program's own loop, even where single durations vary."""
    method = result.method or ""
    if method.startswith(("kernel_pattern:", "graph:")):
        return True
    return method.startswith("nvtx:") and any(re.search(p, method[5:]) for p in (PROFILER_STEP, STEP_NAMES))


def findings(result: Result) -> list[Finding]:
    if not first_is_warmup(result):
        return []
    steady, first, ratio = result.steady_median_ns, result.first_ns, result.first_vs_steady
    start, end, method = result.span_start_ns, result.span_end_ns, result.method
    # first_is_warmup means MIN_ITERATIONS iterations or more, and with two every one of these is set
    assert steady is not None and first is not None and ratio is not None
    assert start is not None and end is not None and method is not None
    if first - steady < MIN_WARMUP_SHARE * (end - start):
        return []
    return [Finding(
        root_cause="profiler-window-on-warmup",
        severity="high" if ratio >= WARMUP_HIGH_RATIO else "medium",
        title=f"the first iteration takes {ratio:.1f}x the steady-state median "
              f"({ms(first)} vs {ms(steady)})",
        evidence={"first_vs_steady": ratio, "first_ns": first,
                  "steady_median_ns": steady, "iteration_count": result.iteration_count,
                  "method": method},
        time_at_stake_ns=int(first - steady), device=device,
        tags=["nvtx-steps" if method.startswith("nvtx:") else "kernel-pattern-steps"])
        for device in result.scope.devices]


def render(result: Result) -> str:
    if not result.iteration_count:
        return f"No iterations found: {result.note}"
    r = result
    lines = [f"{r.iteration_count} iterations by {r.method}; first {ms(r.first_ns)}, steady median "
             f"{ms(r.steady_median_ns)} (first/steady {r.first_vs_steady}), p10 {ms(r.p10_ns)}, p90 {ms(r.p90_ns)} "
             f"(spread {r.spread_ratio}), slowest #{r.slowest_index} {ms(r.slowest_ns)}", f"why: {r.reason}"]
    if r.note:
        lines.append(f"note: {r.note}")
    lines.extend(f"#{row.index:<4} {ms(row.duration_ns):>14}  GPU busy {row.gpu_busy_pct:5.1f}%  start {row.start_ns}"
                 for row in r.rows)
    if r.truncated:
        lines.extend(more_rows(r, r.rows_after(r.total_rows), "iterations"))
    lines.extend(f"outlier #{o.index} {ms(o.duration_ns)} ({o.vs_steady}x steady)" for o in r.outliers)
    lines.extend(f"other range: '{c.name}' depth {c.depth}, {c.ranges} ranges, period {ms(c.median_period_ns)}"
                 for c in r.candidates[1:])
    lines.extend(f"finding [{f.severity}] device {f.device}: {f.title}" for f in r.findings)
    return "\n".join(lines)
