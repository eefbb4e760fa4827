"""Correlation-id ranges for joining activity rows to their CUDA API calls within a flat memory limit.

Each activity table (kernels, memcpy, ...) joins the API call that issued it on (pid, correlation id). On a
large export the API side does not fit the build's memory (29M calls in a 10 GB export), and neither the
DISTINCT ON that picks one call per id nor the hash join spill enough to stay within it. Both sides are
clustered by correlation id (ids grow with time, and exports are written in time order), so the join runs
once per range of ids, each range holding at most rows_per_range() API calls.
"""

from __future__ import annotations

import duckdb

from stallhound.model.duck import one_row
from stallhound.model.limits import build_memory_mb

# API calls joined at once per MB of the build's memory limit: as many as fit, since each further range rereads a
# staged copy, yet few enough that a low limit still builds (BENCHMARKS-HISTORY.md).
CALLS_PER_MB = 6_000
HISTOGRAM_BINS = 4096  # id bins counted to place the cuts: ranges come out within 1/4096 of the id span of full

Range = tuple[int | None, int | None]  # [lo, hi) of correlation ids; None: unbounded on that side
WHOLE: Range = (None, None)


def rows_per_range() -> int:
    """API calls a range may hold under the build's memory limit."""
    return build_memory_mb() * CALLS_PER_MB


def correlation_ranges(con: duckdb.DuckDBPyConnection, rows_per_range: int) -> list[Range]:
    """Consecutive id ranges covering every id, each with at most about `rows_per_range` rows of cuda_api."""
    total, lo, hi = one_row(con.execute("SELECT count(correlation_id), min(correlation_id), max(correlation_id) "
                                        "FROM cuda_api"))
    if total <= rows_per_range:
        return [WHOLE]
    width = (hi - lo) // HISTOGRAM_BINS + 1
    bins = con.execute(f"""SELECT (correlation_id - {lo}) // {width} AS bin, count(*) FROM cuda_api
                           WHERE correlation_id IS NOT NULL GROUP BY bin ORDER BY bin""").fetchall()
    cuts, held = [], 0
    for bin_no, rows in bins:
        if held and held + rows > rows_per_range:
            cuts.append(lo + bin_no * width)
            held = 0
        held += rows
    bounds = [None, *cuts, None]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def within(col: str, bounds: Range, with_null: bool = False) -> str:
    """SQL that `col` lies in `bounds`; `with_null` also takes NULL ids, in the last range only."""
    lo, hi = bounds
    parts = ([f"{col} >= {lo}"] if lo is not None else []) + ([f"{col} < {hi}"] if hi is not None else [])
    if not parts:
        return "TRUE"
    test = " AND ".join(parts)
    return f"({test} OR {col} IS NULL)" if with_null and hi is None else test
