"""How long is each training iteration, is the first one (warmup) much slower, and are there slow outliers?

Boundaries ('method'): a repeated NVTX push/pop range, 'nvtx:<name>': `range_name`, or else the name
(digits removed: 'iteration 3' and 'iteration 4' match) repeating >= 3 times on a thread whose ranges
cover >= half that thread's NVTX span, names like iteration/step/iter/batch first, then the shallowest,
then the most frequent; iteration k runs from the earliest start to the latest end of the k-th such range
over all threads. Else the kernel pattern, 'kernel_pattern:<kernel>': on the first device with kernels,
P = the smallest count >= 3 of a kernel name recurring over >= half the device's active span; the name
seen P times that runs first marks each period; iteration k runs from its k-th start to the next (complete
periods only; rejected when p90/p10 of the periods > 3). gpu_busy_pct = union of kernel time per device
inside the iteration, summed over devices in scope / (duration x devices). first_vs_steady = first /
median of the others; spread_ratio = p90 / p10 of all durations. Window default: capture. Times in ns.
"""

from __future__ import annotations

import statistics
from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.profiles.errors import InvalidRequest
from nsightful.tools.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Scope,
    ScopedParams,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from nsightful.tools.intervals import covered, overlaps

PREFERRED = "(?i)iteration|step|iter|batch"  # names that usually mark one training step
MIN_REPEATS = 3  # fewer repeats on every thread cannot show a steady state
MIN_COVERAGE = 0.5  # the ranges must tile at least half their thread's span (excludes per-op ranges)
WARMUP_RATIO = 1.5  # first iteration this much slower than steady state: the window includes warmup
WARMUP_HIGH_RATIO = 10.0  # book profiler-window-on-warmup: 10-100x is typical of a capture from launch
OUTLIER_RATIO = 2.0  # a later iteration twice the steady median is an isolated slow step
MAX_OUTLIERS = 3  # outlier findings reported
PATTERN_MAX_SPREAD = 3.0  # kernel-pattern periods with p90/p10 above this are not a steady loop: rejected
BUSY_BUCKETS = 16  # overlap-join buckets per typical iteration


class Params(ScopedParams):
    range_name: Annotated[str | None, Field(
        description="NVTX range text marking one iteration (digits ignored, e.g. 'iteration'); omit to "
                    "auto-detect")] = None
    method: Annotated[Literal["auto", "nvtx", "kernel_pattern"], Field(
        description="auto: NVTX when a repeating range exists, else the kernel pattern")] = "auto"
    limit: LimitParam = DEFAULT_LIMIT


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


class Result(BaseModel):
    scope: Scope
    method: str | None = Field(description="'nvtx:<name>' or 'kernel_pattern:<kernel>'; null when none found")
    note: str | None
    iteration_count: int
    first_ns: int | None = None
    steady_median_ns: float | None = Field(None, description="median duration of iterations 2..n")
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


NAME = "trim(regexp_replace(text, '[0-9]+', '', 'g'))"
CANDIDATE_SQL = f"""
WITH pp AS (
  SELECT text, depth, pid, tid, start_ns, end_ns FROM nvtx
  WHERE kind = 'push_pop' AND end_ns IS NOT NULL AND start_ns >= $start AND start_ns < $end),
g AS (SELECT text, depth, pid, tid, count(*) AS n, sum(end_ns - start_ns) AS dur, min(start_ns) AS lo,
           max(end_ns) AS hi FROM pp GROUP BY ALL),
thread AS (SELECT pid, tid, greatest(max(hi) - min(lo), 1) AS span_ns FROM g GROUP BY pid, tid),
t AS (SELECT {NAME} AS name, depth, pid, tid, sum(n) AS n, sum(dur) / any_value(span_ns) AS cover,
             list(text) AS texts FROM g JOIN thread USING (pid, tid) GROUP BY ALL)
SELECT name, depth, flatten(list(texts)) FROM t GROUP BY name, depth
HAVING CASE WHEN $wanted IS NULL THEN bool_or(n >= {MIN_REPEATS} AND cover >= {MIN_COVERAGE})
            ELSE name = trim(regexp_replace($wanted, '[0-9]+', '', 'g')) END
ORDER BY regexp_matches(name, $preferred) DESC, depth, sum(n) DESC, name LIMIT 1
"""
NVTX_SQL = """
WITH r AS (
  SELECT start_ns, end_ns, row_number() OVER (PARTITION BY pid, tid ORDER BY start_ns) - 1 AS k FROM nvtx
  WHERE kind = 'push_pop' AND depth = $depth AND text IN (SELECT unnest($texts)) AND end_ns IS NOT NULL
    AND start_ns >= $start AND start_ns < $end)
SELECT min(start_ns), max(end_ns) FROM r GROUP BY k ORDER BY k
"""
PATTERN_SQL = f"""
WITH k AS (
  SELECT coalesce(short_name, name, '') AS kname, start_ns, end_ns, duration_ns FROM kernels
  WHERE device_id = $device AND start_ns >= $start AND start_ns < $end),
span AS (SELECT min(start_ns) AS lo, max(end_ns) AS hi FROM k),
c AS (SELECT kname, count(*) AS n, min(start_ns) AS first_ns,
             max(start_ns) - min(start_ns) >= {MIN_COVERAGE} * (SELECT hi - lo FROM span) AS recurs
      FROM k GROUP BY kname),
periods AS (SELECT DISTINCT n FROM c WHERE recurs AND n >= {MIN_REPEATS}),
mark AS (SELECT kname FROM c WHERE recurs AND n = (SELECT min(n) FROM periods) ORDER BY first_ns, kname
         LIMIT 1),
s AS (SELECT kname, start_ns, lead(start_ns) OVER (ORDER BY start_ns) AS next_ns FROM k
      WHERE kname = (SELECT kname FROM mark))
SELECT * FROM s WHERE next_ns IS NOT NULL ORDER BY start_ns
"""
BUSY_SQL = """
WITH its AS (SELECT unnest($starts) AS start_ns, unnest($ends) AS end_ns, unnest($idx) AS idx),
probes AS (SELECT row_number() OVER () AS probe_id, i.*, d.device_id
           FROM its i, (SELECT unnest($devices) AS device_id) d),
events AS (SELECT device_id, start_ns, end_ns FROM kernels WHERE device_id IN (SELECT unnest($devices))
           AND end_ns > $lo AND start_ns < $hi AND end_ns > start_ns),
""" + overlaps("pieces", "probes", "events", "device_id") + ",\n" + covered("cov", "pieces") + """
SELECT p.idx, sum(coalesce(c.ns, 0)) FROM probes p LEFT JOIN cov c USING (probe_id) GROUP BY p.idx
"""


def _boundaries(con: duckdb.DuckDBPyConnection, params: Params, scope: Scope
                ) -> tuple[str | None, list[tuple]]:
    """(method, [(start_ns, end_ns), ...]) from NVTX when possible, else from the kernel pattern."""
    window = {"start": scope.start_ns, "end": scope.end_ns}
    if params.method != "kernel_pattern":
        wanted = {**window, "wanted": params.range_name, "preferred": PREFERRED}
        found = con.execute(CANDIDATE_SQL, wanted).fetchone()
        if found:
            spans = con.execute(NVTX_SQL, {**window, "depth": found[1], "texts": found[2]}).fetchall()
            return f"nvtx:{found[0]}", spans
        if params.range_name is not None or params.method == "nvtx":
            what = f"range '{params.range_name}'" if params.range_name else "range that repeats 3+ times"
            raise InvalidRequest(f"no NVTX push/pop {what} in this window; omit range_name to auto-detect, or "
                                 "use method='kernel_pattern' (profiles without NVTX: capture with --trace=nvtx)")
    device = con.execute("SELECT min(device_id) FROM kernels WHERE device_id IN (SELECT unnest($devices)) "
                         "AND start_ns >= $start AND start_ns < $end", scope_args(scope)).fetchone()[0]
    rows = con.execute(PATTERN_SQL, {**window, "device": device}).fetchall()
    spans = [r[1:] for r in rows]
    if len(spans) >= MIN_REPEATS:  # a marker without a steady rhythm is not an iteration boundary
        p10, _, p90 = _deciles([e - s for s, e in spans])
        if p90 > PATTERN_MAX_SPREAD * p10:
            return None, []
    return (f"kernel_pattern:{rows[0][0]}", spans) if rows else (None, [])


def _deciles(values: list[int]) -> tuple[float, float, float]:
    """p10, median, p90 (linear interpolation, as numpy's default)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return cuts[0], cuts[4], cuts[8]


def _busy(con: duckdb.DuckDBPyConnection, scope: Scope, spans: list[tuple]) -> list[float]:
    if not spans or not scope.devices:
        return [0.0] * len(spans)
    bucket = int(max(1000, statistics.median(e - s for s, e in spans) // BUSY_BUCKETS))
    args = {"devices": scope.devices, "starts": [s for s, _ in spans], "ends": [e for _, e in spans],
            "idx": list(range(len(spans))), "lo": min(s for s, _ in spans), "hi": max(e for _, e in spans),
            "bucket_ns": bucket}
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


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    method, spans = _boundaries(con, params, scope)
    shown = spans[:params.limit]
    busy = _busy(con, scope, shown)
    rows = [IterationRow(index=i, start_ns=s, end_ns=e, duration_ns=e - s, gpu_busy_pct=b)
            for i, ((s, e), b) in enumerate(zip(shown, busy, strict=True))]
    note = None if spans else ("no repeating NVTX range and no steady kernel pattern in this window: annotate "
                               "each step with an NVTX range (capture with --trace=nvtx)")
    result = Result(scope=scope, method=method, note=note, iteration_count=len(spans), rows=rows,
                    truncated=len(spans) > params.limit, total_rows=len(spans), **_summary([e - s for s, e in spans]))
    result.findings = findings(result)
    return result


def findings(result: Result) -> list[Finding]:
    out = []
    steady = result.steady_median_ns
    warm = result.first_vs_steady and result.first_vs_steady > WARMUP_RATIO
    if warm and result.iteration_count >= MIN_REPEATS:
        out.append(Finding(
            root_cause="profiler-window-on-warmup",
            severity="high" if result.first_vs_steady >= WARMUP_HIGH_RATIO else "medium",
            title=f"the first iteration takes {result.first_vs_steady:.1f}x the steady-state median "
                  f"({ms(result.first_ns)} vs {ms(steady)})",
            evidence={"first_vs_steady": result.first_vs_steady, "first_ns": result.first_ns,
                      "steady_median_ns": steady or 0, "iteration_count": result.iteration_count},
            time_at_stake_ns=int(result.first_ns - steady)))
    out.extend(Finding(
        root_cause="torch-compile-recompilation", severity="medium",
        title=f"iteration {o.index} takes {o.vs_steady:.1f}x the steady median: an isolated slow step "
              "(recompilation, lazy loading or a pause)",
        evidence={"iteration": o.index, "duration_ns": o.duration_ns, "steady_median_ns": steady or 0},
        time_at_stake_ns=int(o.duration_ns - (steady or 0))) for o in result.outliers)
    return out


def render(result: Result) -> str:
    if not result.iteration_count:
        return f"No iterations found: {result.note}"
    r = result
    lines = [f"{r.iteration_count} iterations by {r.method}; first {ms(r.first_ns)}, steady median "
             f"{ms(r.steady_median_ns)} (first/steady {r.first_vs_steady}), p10 {ms(r.p10_ns)}, p90 {ms(r.p90_ns)} "
             f"(spread {r.spread_ratio}), slowest #{r.slowest_index} {ms(r.slowest_ns)}"]
    lines.extend(f"#{r.index:<4} {ms(r.duration_ns):>14}  GPU busy {r.gpu_busy_pct:5.1f}%  start {r.start_ns}"
                 for r in result.rows)
    if result.truncated:
        lines.append(f"... {result.total_rows - len(result.rows)} more iterations: raise `limit` to see them")
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
