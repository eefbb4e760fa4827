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
  On each qualifying thread iteration k runs from the start of its k-th range to the start of its (k+1)-th, so
  the time between ranges counts in the step; the last range counts, to its own end, only when it lasts at
  least half the thread's median period (else it is the start of a step cut off) or is the only one.
  Threads combine by index: iteration k starts at the median over the threads that have a k-th iteration of
  their k-th starts (a straggling rank does not move it) and ends where iteration k+1 starts, the last at the
  median of those threads' ends; so the iterations tile [span_start_ns, span_end_ns).
* 'kernel_pattern:<kernel>' (no qualifying NVTX range): on the first device in scope with kernels, a kernel
  name marks steps when it runs >= 3 times, its first to last start covers at least half the device's first to
  last kernel, at least 75% of its periods (start to next start) lie within 25% of their median, and those
  fill at least a quarter of the time after its first period. The coarsest such rhythm wins (fewest runs, then
  the one that runs first, so boundaries fall on a step's first kernel); iteration k runs from its k-th start
  to its (k+1)-th.
gpu_busy_pct: per device in scope, the union of its kernel, memcpy and memset intervals inside the iteration
(busy as gpu_utilization counts it), summed over the devices / (duration x devices). steady_median_ns = median
duration of iterations 1..n-1; first_vs_steady = first / steady median; spread_ratio = p90 / p10 of all
durations; outliers: later iterations above 2x the steady median (data only: their cause is not decided here).
Times in ns.
"""

from __future__ import annotations

import re
import statistics
from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.profiles.errors import InvalidRequest
from nsightful.tools.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Output,
    Scope,
    ScopedParams,
    more_rows,
    ms,
    packed,
    pct,
    resolve_scope,
    unpacked,
)
from nsightful.tools.intervals import GPU_WORK, covered, overlaps

MIN_REPEATS = 3  # ranges (or marker kernels) per thread: fewer cannot show a period, let alone a steady one
MIN_ITERATIONS = 3  # a first iteration plus two to take a steady median from
MIN_GPU_SHARE = 0.5  # a step range launches GPU work most times; CPU-only ranges (logging, I/O) cannot time it
LAST_RANGE_MIN_SHARE = 0.5  # a last range shorter than half a period is the start of a step cut off by the window
PROFILER_STEP = "^ProfilerStep#"  # torch.profiler's own step range: the step by definition
STEP_NAMES = "(?i)step|iter|train|batch|forward"  # words people name one training or inference step with
METADATA = ", (seq|op_id|sizes|input_op_ids|input_dims) = .*$"  # PyTorch record_function / emit_nvtx suffix
AUTOGRAD = ", seq = "  # emit_nvtx tags autograd functions with their sequence number
PER_OP = "|".join((
    r"^(aten|prim|c10d|_c10d_functional|c10d_functional|flash_attn|autograd|torch::autograd|cub|thrust|cutlass"
    r"|triton|xformers|fbgemm|quantized|torchvision|inductor)::",  # operator namespaces
    r"^(cublas|cublasLt|cudnn|cusparse|cufft|curand|cusolver|nccl|nvshmem)[A-Z_:]",  # library calls
    r"^record_param_comms(,|$)",  # PyTorch's record of one collective call
    r"^P?MPI_[A-Za-z_]+$",  # one MPI call (MPI_Send, MPI_Recv, ...)
    r"^Thunk:",  # XLA: one range per HLO op executed
    r"\.(py|pyx|c|cc|cpp|cxx|cu|cuh|h|hpp|f|f90|jl)(\([0-9]+\)|:[0-9]+)",  # source-line markers
))
MAX_CANDIDATES = 5  # qualifying NVTX ranges listed, the chosen one first
PERIOD_TOLERANCE = 0.25  # a loop's period jitters by a few %; 25% still rejects a kernel run twice per step
STABLE_SHARE = 0.75  # a quarter of the periods may be disturbed (a recompilation, a GC pause, a checkpoint)
STABLE_TIME_SHARE = 0.25  # steady periods fill a quarter of the time after the first: a loop may pause at
#                           times (a checkpoint, a GC), but bursts between long pauses (a JIT compile each) are no loop
MIN_SPAN_SHARE = 0.5  # the marker recurs over at least half the device's kernel span: a loop, not a burst
WARMUP_RATIO = 1.5  # first iteration this much slower than steady state: the window includes warmup
WARMUP_HIGH_RATIO = 10.0  # book profiler-window-on-warmup: 10-100x is typical of a capture from launch
MIN_WARMUP_SHARE = 0.01  # warmup excess below 1% of the iterations' span skews no window-wide figure by more
IRREGULAR_SPREAD = 3.0  # p90/p10 of durations above this: the boundaries do not time one repeating step
OUTLIER_RATIO = 2.0  # a later iteration twice the steady median is an isolated slow step
MAX_OUTLIERS = 3  # outliers listed, slowest first
BUSY_BUCKETS = 16  # overlap-join buckets per typical iteration


class Params(ScopedParams):
    range_name: Annotated[str | None, Field(
        description="NVTX range marking one iteration, e.g. 'iteration N' or 'train_step' (letters compared, "
                    "case and numbers ignored); omit to auto-detect")] = None
    method: Annotated[Literal["auto", "nvtx", "kernel_pattern"], Field(
        description="auto: NVTX when a range qualifies, else the kernel pattern")] = "auto"
    limit: LimitParam = DEFAULT_LIMIT


class Candidate(BaseModel):
    name: str = Field(description="range text without PyTorch metadata; N for an instance counter")
    kind: Literal["push_pop", "start_end"]
    depth: int = Field(description="push/pop nesting depth on its thread, 0 = outermost (start/end: 0)")
    counter: bool = Field(description="true when texts differing in their N were taken as one range")
    ranges: int = Field(description="ranges on the qualifying threads")
    threads: int = Field(description="threads where it occurs 3+ times, half of them with GPU work")
    gpu_ranges_pct: float = Field(description="share of those ranges that launch GPU work")
    median_period_ns: float | None = Field(description="median over threads of the median start-to-start lag")


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


class Result(Output):
    scope: Scope
    method: str | None = Field(description="'nvtx:<name>' or 'kernel_pattern:<kernel>'; null when none found")
    reason: str | None = Field(description="why these boundaries: the range or kernel, its counts and the rule")
    candidates: list[Candidate] = Field(description=f"qualifying NVTX ranges, the chosen first, at most "
                                                    f"{MAX_CANDIDATES}; pass another's name as range_name")
    note: str | None = Field(description="set when there are no or too few iterations, and why")
    iteration_count: int
    span_start_ns: int | None = Field(None, description="start of the first iteration")
    span_end_ns: int | None = Field(None, description="end of the last iteration")
    first_ns: int | None = None
    steady_median_ns: float | None = Field(None, description="median duration of iterations 1..n-1")
    first_vs_steady: float | None = None
    mean_ns: float | None = None
    std_ns: float | None = None
    p10_ns: float | None = None
    p90_ns: float | None = None
    spread_ratio: float | None = Field(None, description="p90 / p10 of all iteration durations")
    slowest_index: int | None = None
    slowest_ns: int | None = None
    outliers: list[Outlier] = Field([], description=f"later iterations above {OUTLIER_RATIO}x the steady median")
    rows: list[IterationRow] = Field(description="the first `limit` iterations")
    truncated: bool
    total_rows: int
    findings: list[Finding] = []


# NVTX candidates, in one pass over the ranges. `named` gives every range outside the per-op set its range name
# (counter families merged). 'aten::' and the autograd tag, most per-op ranges of PyTorch profiles, are tested
# first, and a CASE keeps the regex off those rows. `flagged` marks the ranges whose thread launches GPU work
# inside them: an ASOF join finds, per range, the thread's first launch at or after its start, which is inside
# when it starts before the range ends. Every candidate row carries the ranges of the best one (rank 1) on its
# qualifying threads.
LETTERS = "lower(regexp_replace(regexp_replace({}, '\\bN\\b|[0-9]+', '', 'g'), '[^A-Za-z]', '', 'g'))"
NVTX_SQL = """
WITH ranges AS (
  SELECT pid, tid, kind, coalesce(depth, 0) AS depth, start_ns, end_ns, regexp_replace(text, $metadata, '') AS clean
  FROM nvtx WHERE kind IN ('push_pop', 'start_end') AND end_ns IS NOT NULL AND text IS NOT NULL
    AND start_ns >= $start AND end_ns <= $end
    AND ($wanted IS NOT NULL OR CASE WHEN starts_with(text, 'aten::') OR contains(text, $autograd) THEN false
                                     ELSE NOT regexp_matches(text, $per_op) END)),
steps AS MATERIALIZED (
  SELECT *, regexp_replace(clean, '[0-9]+', 'N', 'g') AS template,
         list_transform(regexp_extract_all(clean, '[0-9]+'), lambda x: lpad(x, 40, '0')) AS nums FROM ranges),
families AS (
  SELECT template, kind, depth, count(DISTINCT clean) > 1 AND bool_and(prev IS NULL OR nums > prev) AS counter
  FROM (SELECT *, lag(nums) OVER (PARTITION BY template, kind, depth, pid, tid ORDER BY start_ns, end_ns) AS prev
        FROM steps)
  GROUP BY ALL),
named AS (
  SELECT * FROM (
    SELECT s.pid, s.tid, s.kind, s.depth, s.start_ns, s.end_ns, f.counter,
           CASE WHEN f.counter THEN s.template ELSE s.clean END AS name
    FROM steps s JOIN families f USING (template, kind, depth))
  WHERE $wanted IS NULL OR name = $wanted OR """ + LETTERS.format("name") + " = " + LETTERS.format("$wanted") + """),
repeating AS (
  SELECT *, start_ns - lag(start_ns) OVER (PARTITION BY name, kind, depth, pid, tid ORDER BY start_ns) AS period_ns
  FROM named QUALIFY count(*) OVER (PARTITION BY name, kind, depth, pid, tid) >= $min_repeats),
launches AS (
  SELECT pid, tid, launch_start_ns AS at_ns FROM kernels
  WHERE device_id IN (SELECT unnest($devices)) AND launch_start_ns >= $start AND launch_start_ns < $end
  UNION ALL
  SELECT a.pid, a.tid, a.start_ns FROM (SELECT pid, correlation_id, device_id FROM memcpy
                                        UNION ALL SELECT pid, correlation_id, device_id FROM memset) m
  JOIN cuda_api a USING (pid, correlation_id)
  WHERE m.device_id IN (SELECT unnest($devices)) AND a.start_ns >= $start AND a.start_ns < $end
  UNION ALL
  SELECT pid, tid, start_ns FROM cuda_api WHERE kind = 'graph' AND start_ns >= $start AND start_ns < $end),
flagged AS MATERIALIZED (
  SELECT r.*, coalesce(l.at_ns < r.end_ns, false) AS gpu
  FROM repeating r ASOF LEFT JOIN launches l ON r.pid = l.pid AND r.tid = l.tid AND r.start_ns <= l.at_ns),
threads AS MATERIALIZED (
  SELECT name, kind, depth, pid, tid, any_value(counter) AS counter, count(*) AS n,
         count(*) FILTER (WHERE gpu) AS n_gpu, min(start_ns) AS first_ns, median(period_ns) AS period_ns
  FROM flagged GROUP BY name, kind, depth, pid, tid
  HAVING $wanted IS NOT NULL OR count(*) FILTER (WHERE gpu) >= $min_gpu_share * count(*)),
candidates AS (
  SELECT name, kind, depth, any_value(counter) AS counter, sum(n)::BIGINT AS n, count(*) AS threads,
         sum(n_gpu)::BIGINT AS n_gpu, median(period_ns) AS period_ns, max(n) AS most, min(first_ns) AS first_ns,
         CASE WHEN regexp_matches(name, $profiler_step) THEN 0 WHEN regexp_matches(name, $step_names) THEN 1
              ELSE 2 END AS tier
  FROM threads GROUP BY name, kind, depth),
ranked AS (
  SELECT *, row_number() OVER (ORDER BY name = $wanted DESC NULLS LAST, tier, depth, most, first_ns, name, kind)
         AS rank
  FROM candidates),
best AS (
  SELECT list([f.pid, f.tid, f.start_ns, f.end_ns] ORDER BY f.pid, f.tid, f.start_ns, f.end_ns) AS ranges
  FROM flagged f JOIN threads USING (name, kind, depth, pid, tid) JOIN ranked r USING (name, kind, depth)
  WHERE r.rank = 1)
SELECT name, kind, depth, counter, n, threads, n_gpu, period_ns, tier, (SELECT ranges FROM best) FROM ranked
WHERE rank <= $limit ORDER BY rank
"""

# Kernel pattern: per kernel name on one device, its periods (start to next start) against their median; the
# second run's period is the first one (warmup), left out of the time share.
PATTERN_SQL = """
WITH k AS (
  SELECT coalesce(short_name, name, '') AS kname, start_ns, end_ns FROM kernels
  WHERE device_id = $device AND start_ns >= $start AND end_ns <= $end),
runs AS (
  SELECT kname, start_ns, start_ns - lag(start_ns) OVER w AS period, row_number() OVER w AS nth,
         min(start_ns) OVER (PARTITION BY kname) AS first_ns
  FROM k WINDOW w AS (PARTITION BY kname ORDER BY start_ns) QUALIFY count(*) OVER (PARTITION BY kname) >= $min_repeats),
periods AS (
  SELECT *, abs(period - median(period) OVER (PARTITION BY kname)) <= $tolerance * median(period) OVER (
         PARTITION BY kname) AS steady FROM runs WHERE period IS NOT NULL),
rated AS (
  SELECT kname, count(*) + 1 AS n, any_value(first_ns) AS first_ns, median(period) AS med,
         avg(steady::INTEGER) AS stable,
         coalesce(sum(period) FILTER (WHERE steady AND nth > 2) / nullif(sum(period) FILTER (WHERE nth > 2), 0), 0)
           AS stable_time,
         max(start_ns) - any_value(first_ns) >= $min_span_share * (SELECT max(end_ns) - min(start_ns) FROM k) AS recurs
  FROM periods GROUP BY kname)
SELECT kname, n, med, stable, stable_time, recurs,
       stable >= $stable_share AND stable_time >= $stable_time_share AND recurs AS marks
FROM rated
ORDER BY marks DESC, CASE WHEN marks THEN n END, CASE WHEN marks THEN first_ns END, recurs DESC, stable DESC, kname
LIMIT 1
"""
MARKER_SQL = """
SELECT start_ns FROM kernels WHERE device_id = $device AND coalesce(short_name, name, '') = $kname
  AND start_ns >= $start AND end_ns <= $end ORDER BY start_ns
"""

BUSY_SQL = "WITH " + GPU_WORK + """,
its AS (SELECT unnest(""" + unpacked("$starts") + """) AS start_ns, unnest(""" + unpacked("$ends") + """) AS end_ns,
               generate_subscripts(""" + unpacked("$starts") + """, 1) - 1 AS idx),
probes AS (SELECT row_number() OVER () AS probe_id, i.*, d.device_id
           FROM its i, (SELECT unnest($devices) AS device_id) d),
""" + overlaps("pieces", "probes", "gpu_work", "device_id") + ",\n" + covered("cov", "pieces") + """
SELECT p.idx, sum(coalesce(c.ns, 0)) FROM probes p LEFT JOIN cov c USING (probe_id) GROUP BY p.idx
"""

Spans = list[tuple[int, int]]


def _candidates(con: duckdb.DuckDBPyConnection, params: Params, scope: Scope
                ) -> tuple[list[Candidate], int | None, list[list]]:
    """(qualifying NVTX ranges best first, the best's tier, its [pid, tid, start_ns, end_ns] ranges)."""
    wanted = params.range_name
    rows = con.execute(NVTX_SQL, {
        "start": scope.start_ns, "end": scope.end_ns, "devices": scope.devices, "wanted": wanted,
        "metadata": METADATA, "autograd": AUTOGRAD, "per_op": PER_OP, "min_repeats": 1 if wanted else MIN_REPEATS,
        "min_gpu_share": MIN_GPU_SHARE, "profiler_step": PROFILER_STEP, "step_names": STEP_NAMES,
        "limit": MAX_CANDIDATES}).fetchall()
    found = [Candidate(name=name, kind=kind, depth=depth, counter=counter, ranges=n, threads=threads,
                       gpu_ranges_pct=pct(n_gpu, n), median_period_ns=period)
             for name, kind, depth, counter, n, threads, n_gpu, period, _, _ in rows]
    return found, rows[0][8] if rows else None, rows[0][9] if rows else []


def _thread_spans(ranges: Spans) -> Spans:
    """Start to next start; the last range to its own end when it covers a step."""
    starts = [s for s, _ in ranges]
    spans = list(zip(starts, starts[1:], strict=False))
    last_start, last_end = ranges[-1]
    periods = [e - s for s, e in spans]
    if not periods or last_end - last_start >= LAST_RANGE_MIN_SHARE * statistics.median(periods):
        spans.append((last_start, last_end))
    return spans


def _combine(per_thread: list[Spans]) -> Spans:
    """Iteration k starts at the median k-th start of the threads that have one and ends where k+1 starts."""
    count = max(map(len, per_thread))
    starts = [int(statistics.median(t[k][0] for t in per_thread if len(t) > k)) for k in range(count)]
    last_end = int(statistics.median(t[-1][1] for t in per_thread if len(t) == count))
    return [(s, e) for s, e in zip(starts, [*starts[1:], last_end], strict=True) if e > s]


def _nvtx(con: duckdb.DuckDBPyConnection, params: Params, scope: Scope
          ) -> tuple[list[Candidate], str | None, Spans]:
    """(qualifying candidates, reason, spans) from the best NVTX range; no candidates when none qualifies."""
    found, tier, ranges = _candidates(con, params, scope)
    if not found:
        return [], None, []
    per_thread: dict[tuple[int, int], Spans] = {}
    for pid, tid, start, end in ranges:
        per_thread.setdefault((pid, tid), []).append((start, end))
    best = found[0]
    why = ("requested by range_name" if params.range_name else
           ("torch.profiler's step range", "named like a step", "the outermost repeating range with GPU work")[tier])
    reason = (f"'{best.name}' ({why}): {best.ranges} ranges on {best.threads} thread(s), {best.gpu_ranges_pct}% "
              f"launching GPU work, median period {ms(best.median_period_ns)}"
              + (f"; {len(found) - 1} other range(s) qualified, see candidates" if len(found) > 1 else ""))
    return found, reason, _combine([_thread_spans(r) for r in per_thread.values()])


def _kernel_pattern(con: duckdb.DuckDBPyConnection, scope: Scope) -> tuple[str | None, str, Spans]:
    """(marker kernel, reason or why none, spans) on the first device in scope with kernels."""
    window = {"start": scope.start_ns, "end": scope.end_ns}
    device = con.execute("SELECT min(device_id) FROM kernels WHERE device_id IN (SELECT unnest($devices)) "
                         "AND start_ns >= $start AND end_ns <= $end", {**window, "devices": scope.devices}
                         ).fetchone()[0]
    if device is None:
        return None, "no kernels on the devices in scope in this window", []
    best = con.execute(PATTERN_SQL, {**window, "device": device, "min_repeats": MIN_REPEATS,
                                     "tolerance": PERIOD_TOLERANCE, "min_span_share": MIN_SPAN_SHARE,
                                     "stable_share": STABLE_SHARE, "stable_time_share": STABLE_TIME_SHARE}
                       ).fetchone()
    if best is None:
        return None, f"no kernel runs {MIN_REPEATS}+ times on device {device}", []
    kname, n, period, stable, stable_time, recurs, marks = best
    rhythm = (f"{n} runs, median period {ms(period)}, {100 * stable:.0f}% of periods within {PERIOD_TOLERANCE:.0%} "
              f"of it, filling {100 * stable_time:.0f}% of the time after the first")
    if not marks:
        return None, (f"no kernel on device {device} recurs with a stable period over half its kernel span (needs "
                      f"{STABLE_SHARE:.0%} of periods within {PERIOD_TOLERANCE:.0%} of the median, filling "
                      f"{STABLE_TIME_SHARE:.0%} of the time; closest: '{kname}', {rhythm}"
                      f"{'' if recurs else ', over less than half the span'})"), []
    starts = [s for (s,) in con.execute(MARKER_SQL, {**window, "device": device, "kname": kname}).fetchall()]
    reason = f"kernel '{kname}' on device {device}: {rhythm}; the coarsest stable rhythm"
    return kname, reason, list(zip(starts, starts[1:], strict=False))


def _deciles(values: list[int]) -> tuple[float, float, float]:
    """p10, median, p90 (linear interpolation, as numpy's default)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return cuts[0], cuts[4], cuts[8]


def _busy(con: duckdb.DuckDBPyConnection, scope: Scope, spans: Spans) -> list[float]:
    if not spans or not scope.devices:
        return [0.0] * len(spans)
    bucket = int(max(1000, statistics.median(e - s for s, e in spans) // BUSY_BUCKETS))
    args = {"devices": scope.devices, "starts": packed(s for s, _ in spans), "ends": packed(e for _, e in spans),
            "start": spans[0][0], "end": max(e for _, e in spans), "bucket_ns": bucket}
    busy = dict(con.execute(BUSY_SQL, args).fetchall())
    return [pct(busy.get(i, 0), (e - s) * len(scope.devices)) for i, (s, e) in enumerate(spans)]


def _summary(durations: list[int]) -> dict:
    if not durations:
        return {}
    steady = statistics.median(durations[1:]) if len(durations) > 1 else None
    p10, _, p90 = _deciles(durations)
    slowest = max(range(len(durations)), key=lambda i: (durations[i], -i))
    slow = sorted((i for i in range(1, len(durations)) if steady and durations[i] > OUTLIER_RATIO * steady),
                  key=lambda i: (-durations[i], i))
    return {"outliers": [Outlier(index=i, duration_ns=durations[i], vs_steady=round(durations[i] / steady, 3))
                         for i in slow[:MAX_OUTLIERS]],
            "first_ns": durations[0], "steady_median_ns": steady,
            "first_vs_steady": round(durations[0] / steady, 3) if steady else None,
            "mean_ns": round(statistics.fmean(durations), 1), "std_ns": round(statistics.pstdev(durations), 1),
            "p10_ns": p10, "p90_ns": p90, "spread_ratio": round(p90 / p10, 3) if p10 else None,
            "slowest_index": slowest, "slowest_ns": durations[slowest]}


def _boundaries(con: duckdb.DuckDBPyConnection, params: Params, scope: Scope
                ) -> tuple[str | None, str | None, list[Candidate], Spans]:
    """(method, reason or why none, NVTX candidates, spans): NVTX when a range qualifies, else the kernels."""
    nvtx = "" if params.method == "kernel_pattern" else (
        f"no NVTX range occurs {MIN_REPEATS}+ times on a thread with GPU work; ")
    if params.method != "kernel_pattern":
        candidates, reason, spans = _nvtx(con, params, scope)
        if candidates:
            return f"nvtx:{candidates[0].name}", reason, candidates, spans
        if params.range_name is not None or params.method == "nvtx":
            what = f"range '{params.range_name}'" if params.range_name else (
                f"range that occurs {MIN_REPEATS}+ times on a thread with GPU work, outside per-op ranges,")
            raise InvalidRequest(f"no NVTX {what} in this window; omit range_name and method to auto-detect (the "
                                 "result's candidates then lists the ranges that qualify), or use "
                                 "method='kernel_pattern'")
    kname, reason, spans = _kernel_pattern(con, scope)
    return (f"kernel_pattern:{kname}" if kname else None), nvtx + reason, [], spans


def _note(method: str | None, reason: str | None, count: int, spread: float | None) -> str | None:
    if method is None:
        return f"{reason}; annotate each step with an NVTX range (capture with --trace=nvtx)"
    if count < MIN_ITERATIONS:
        return (f"only {count} iteration(s) by {method}: too few to tell warmup from steady state (needs "
                f"{MIN_ITERATIONS}); capture more steps")
    if spread is not None and spread > IRREGULAR_SPREAD:
        return (f"durations vary widely (p90/p10 = {spread}): these boundaries may not time one repeating step; "
                "check the candidates or pass range_name")
    return None


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    method, reason, candidates, spans = _boundaries(con, params, scope)
    shown = spans[:params.limit]
    busy = _busy(con, scope, shown)
    rows = [IterationRow(index=i, start_ns=s, end_ns=e, duration_ns=e - s, gpu_busy_pct=b)
            for i, ((s, e), b) in enumerate(zip(shown, busy, strict=True))]
    summary = _summary([e - s for s, e in spans])
    result = Result(scope=scope, method=method, reason=reason if method else None, candidates=candidates,
                    note=_note(method, reason, len(spans), summary.get("spread_ratio")), iteration_count=len(spans),
                    span_start_ns=spans[0][0] if spans else None, span_end_ns=spans[-1][1] if spans else None,
                    rows=rows, truncated=len(spans) > params.limit, total_rows=len(spans), **summary)
    result.findings = findings(result)
    return result


def first_is_warmup(result: Result) -> bool:
    """The first iteration is a warmup outlier: slower than WARMUP_RATIO x steady, with enough iterations."""
    return (result.iteration_count >= MIN_ITERATIONS and result.first_vs_steady is not None
            and result.first_vs_steady > WARMUP_RATIO)


def steady_window(result: Result, irregular_ok: bool = False) -> tuple[int, int] | None:
    """(start_ns, end_ns) of steady state: from the first steady iteration (the second when the first is the
    warmup outlier) to the end of the last; None with fewer than MIN_ITERATIONS iterations or irregular ones
    (the boundaries may not time a step) unless irregular_ok. Iterations tile: the second starts where the
    first ends."""
    irregular = result.spread_ratio is not None and result.spread_ratio > IRREGULAR_SPREAD
    if result.iteration_count < MIN_ITERATIONS or (irregular and not irregular_ok):
        return None
    return result.span_start_ns + (result.first_ns if first_is_warmup(result) else 0), result.span_end_ns


def step_named(result: Result) -> bool:
    """The boundaries come from a stable kernel rhythm, torch.profiler's step range or a range named like a step:
    the program's own loop, even where single durations vary."""
    method = result.method or ""
    if method.startswith("kernel_pattern:"):
        return True
    return method.startswith("nvtx:") and any(re.search(p, method[5:]) for p in (PROFILER_STEP, STEP_NAMES))


def findings(result: Result) -> list[Finding]:
    if not first_is_warmup(result):
        return []
    steady = result.steady_median_ns
    if result.first_ns - steady < MIN_WARMUP_SHARE * (result.span_end_ns - result.span_start_ns):
        return []
    return [Finding(
        root_cause="profiler-window-on-warmup",
        severity="high" if result.first_vs_steady >= WARMUP_HIGH_RATIO else "medium",
        title=f"the first iteration takes {result.first_vs_steady:.1f}x the steady-state median "
              f"({ms(result.first_ns)} vs {ms(steady)})",
        evidence={"first_vs_steady": result.first_vs_steady, "first_ns": result.first_ns,
                  "steady_median_ns": steady, "iteration_count": result.iteration_count,
                  "method": result.method},
        time_at_stake_ns=int(result.first_ns - steady), device=device,
        tags=["nvtx-steps" if result.method.startswith("nvtx:") else "kernel-pattern-steps"])
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
        lines.extend(more_rows(r, r.total_rows - len(r.rows), "iterations"))
    lines.extend(f"outlier #{o.index} {ms(o.duration_ns)} ({o.vs_steady}x steady)" for o in r.outliers)
    lines.extend(f"other range: '{c.name}' depth {c.depth}, {c.ranges} ranges, period {ms(c.median_period_ns)}"
                 for c in r.candidates[1:])
    lines.extend(f"finding [{f.severity}] device {f.device}: {f.title}" for f in r.findings)
    return "\n".join(lines)
