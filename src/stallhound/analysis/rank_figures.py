"""Per-rank figures of a job connection (every model table a view with a leading `rank` column): GPU time
shares, per-collective waits, step times and the spread of one kernel's duration across ranks.

Definitions are in tools/rank_imbalance.py's docstring; this module only computes them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import nccl_arrival
from stallhound.analysis.common import ScopedParams, pct, resolve_scope
from stallhound.analysis.step_boundaries import Spans, boundaries
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest
from stallhound.model.schema import TABLE_NAMES
from stallhound.model.sql_files import sql_beside

KERNELS_SHOWN = 5  # kernels whose spread is listed: the costliest few carry the time
HISTOGRAM_BINS = 8  # equal-width bins per histogram: the shape of 8 or 800 ranks in one line each

SHARES_SQL = sql_beside(__package__, "rank_shares.sql")

# Matching on arrival is nccl_arrival's, with ranks in the place of devices: its kernels CTE gives each NCCL
# kernel its rank as device_id, and $devices lists the ranks, $start/$end span the job.
RANK_KERNELS = "WITH kernels AS (SELECT rank AS device_id, category, nccl_collective, start_ns, end_ns FROM kernels),"
ARRIVAL = nccl_arrival.MATCH.replace("WITH n AS", RANK_KERNELS + "\nn AS", 1) + """,
w AS (
  SELECT a.device_id AS rank, a.coll, a.idx AS k, a.end_ns - a.start_ns AS dur,
         least(m.last_ns, a.end_ns) - a.start_ns AS wait
  FROM aligned a JOIN matched m USING (coll, idx))"""

# Matching on durations (no common clock): collective k of a kind on a rank is its k-th NCCL kernel of that kind
# in start order; the ranks that ran the kind take part, and (kind, k) is matched when each has a k-th. A rank's
# wait: its kernel duration minus the shortest of the collective.
DURATIONS = """
WITH n AS (
  SELECT rank, coalesce(nccl_collective, 'other') AS coll, end_ns - start_ns AS dur,
         row_number() OVER (PARTITION BY rank, coalesce(nccl_collective, 'other') ORDER BY start_ns, end_ns) AS k
  FROM kernels WHERE category = 'nccl' AND end_ns > start_ns),
parts AS (SELECT coll, count(DISTINCT rank) AS parts FROM n GROUP BY coll HAVING count(DISTINCT rank) >= 2),
groups AS (SELECT coll, k, min(dur) AS min_dur FROM n JOIN parts USING (coll) GROUP BY coll, k, parts
           HAVING count(*) = parts),
w AS (SELECT n.rank, n.coll, n.k, n.dur, n.dur - g.min_dur AS wait FROM n JOIN groups g USING (coll, k))"""

# Per matched collective: the rank that waits least arrived last (lowest rank on a tie); lead = the
# second-least wait minus the least; transfer = the last rank's kernel duration.
PER = """,
per AS (
  SELECT coll, k, arg_min(rank, (wait, rank)) AS last_rank, max(wait) - min(wait) AS skew,
         list(wait ORDER BY wait)[2] - min(wait) AS lead, arg_min(dur, (wait, rank)) AS transfer
  FROM w GROUP BY coll, k)"""
SUMMARY = PER + """
SELECT count(*), median(skew), quantile_cont(skew, 0.9), median(transfer), (SELECT count(*) FROM n),
       (SELECT count(*) FROM w) FROM per
"""
# Per (rank, last rank): collectives, the rank's wait and NCCL time in them, and the median lead of the last rank.
RANK_WAITS = PER + """
SELECT w.rank, p.last_rank, count(*), sum(w.wait), sum(w.dur), median(p.lead)
FROM w JOIN per p USING (coll, k) GROUP BY ALL ORDER BY ALL
"""
MATCHING = {"arrival": ARRIVAL, "durations": DURATIONS}

KERNEL_SPREAD_SQL = """
WITH per AS (
  SELECT coalesce(short_name, name, '') AS kname, rank, count(*) AS n, avg(duration_ns) AS mean,
         sum(duration_ns) AS total
  FROM kernels WHERE category <> 'nccl' GROUP BY ALL)
SELECT kname, count(*), sum(n), sum(total), min(mean), median(mean), max(mean), arg_max(rank, (mean, -rank))
FROM per GROUP BY kname HAVING count(*) >= 2 ORDER BY sum(total) DESC, kname LIMIT $limit
"""


@dataclass
class RankWait:
    """One rank's side of the matched collectives."""
    collectives: int = 0
    wait_ns: int = 0
    nccl_ns: int = 0
    last_count: int = 0
    lateness_ns: int = 0  # median lead over the collectives it arrived last to
    # last rank -> this rank's wait in the collectives it was last to
    waits_by_last: dict[int, int] = field(default_factory=dict)


def match_args(con: duckdb.DuckDBPyConnection, basis: str) -> dict[str, object]:
    """The bound parameters of MATCHING[basis]."""
    if basis == "durations":
        return {}
    ranks, start, end = one_row(con.execute("SELECT list(rank ORDER BY rank), min(capture_start_ns), "
                                            "max(capture_end_ns) FROM meta"))
    return {"devices": ranks, "start": start, "end": end, "max_shift": nccl_arrival.MAX_SHIFT}


def summary(con: duckdb.DuckDBPyConnection, basis: str) -> tuple:
    """(matched, median skew, p90 skew, median transfer, NCCL kernels, matched kernels)."""
    return one_row(con.execute(MATCHING[basis] + SUMMARY, match_args(con, basis)))


def rank_waits(con: duckdb.DuckDBPyConnection, basis: str) -> dict[int, RankWait]:
    out: dict[int, RankWait] = {}
    rows = con.execute(MATCHING[basis] + RANK_WAITS, match_args(con, basis)).fetchall()
    for rank, last, count, wait, dur, lead in rows:
        mine = out.setdefault(rank, RankWait())
        mine.collectives += count
        mine.wait_ns += int(wait)
        mine.nccl_ns += int(dur)
        mine.waits_by_last[last] = int(wait)
        if last == rank:
            mine.last_count, mine.lateness_ns = count, int(lead or 0)
    return out


ROWID_TABLES = ("diagnostics", "nvtx")  # tables skills read by rowid (load-note order, a range's identity), which a
# view over the job's Parquet lacks: numbered in scan order instead
# A rank that is one process or device of a file keeps the file's meta, fingerprint included; results cached by
# fingerprint (common.per_model) must not pass between such ranks, so theirs names their processes and devices.
PART_FINGERPRINT = """CASE WHEN (SELECT count(*) FROM "{db}".main.ranks WHERE profile_id =
  (SELECT any_value(profile_id) FROM "{db}".main.ranks WHERE rank = {rank})) > 1
THEN fingerprint || '#pids ' || (SELECT list_sort(list(DISTINCT pid))::VARCHAR FROM "{db}".main.processes
  WHERE rank = {rank}) || ' devices ' || (SELECT list_sort(list(DISTINCT device_id))::VARCHAR FROM "{db}".main.gpus
  WHERE rank = {rank}) ELSE fingerprint END"""

# The job's meta holds the job's rank in place of the model's own (NULL unless the profile recorded one, as its
# rank_source says): a rank's view shows the model's.
META_COLUMNS = (f"* REPLACE ({PART_FINGERPRINT} AS fingerprint, "
                "CASE WHEN rank_source IS NULL THEN NULL ELSE rank END::INTEGER AS rank)")


@contextmanager
def rank_view(con: duckdb.DuckDBPyConnection, rank: int) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor on which every model table is rank `rank`'s alone (temporary views, private to the cursor), so
    single-profile skills run on one rank unchanged."""
    cur = con.cursor()
    try:
        database = one_row(cur.execute("SELECT current_database()"))[0].replace('"', '""')
        for table in TABLE_NAMES:
            star = META_COLUMNS if table == "meta" else "* EXCLUDE (rank)"
            star += ", row_number() OVER () - 1 AS rowid" if table in ROWID_TABLES else ""
            cur.execute(f'CREATE TEMP VIEW {table} AS SELECT {star.format(db=database, rank=int(rank))} '
                        f'FROM "{database}".main.{table} WHERE rank = {int(rank)}')
        yield cur
    finally:
        cur.close()


@dataclass
class RankSteps:
    """One rank's steps, as the iterations tool finds them on the rank alone."""
    method: str | None  # iterations' method: 'nvtx:<range>', 'graph:<call>' or 'kernel_pattern:<kernel>'
    durations: list[int]  # each step's duration, in time order
    numbers: list[tuple[int, ...]] | None  # each step's numbers in its marker's name (ProfilerStep#10: (10,)),
    #                                        strictly increasing; None when the steps have no such numbers


def _marker_numbers(cur: duckdb.DuckDBPyConnection, method: str | None, spans: Spans) -> list[tuple[int, ...]] | None:
    """Each span's numbers in the text of its marker range (the one starting nearest the span's start), when the
    method is an NVTX range whose name holds numbers and they strictly increase step to step; else None."""
    template = re.sub("[0-9]+", "N", method.removeprefix("nvtx:")) if method and method.startswith("nvtx:") else ""
    parts = template.split("N")
    if len(parts) < 2 or not spans:
        return None
    pattern = re.compile("([0-9]+)".join(map(re.escape, parts)))
    marks = [(start, tuple(int(n) for n in m.groups())) for start, text in cur.execute(
        "SELECT start_ns, text FROM nvtx WHERE starts_with(text, $prefix) AND start_ns >= $lo AND start_ns < $hi "
        "ORDER BY start_ns", {"prefix": parts[0], "lo": spans[0][0], "hi": spans[-1][1]}).fetchall()
        if (m := pattern.match(text))]
    if not marks:
        return None
    numbers = [min(marks, key=lambda mark: abs(mark[0] - start))[1] for start, _ in spans]
    return numbers if all(a < b for a, b in zip(numbers, numbers[1:], strict=False)) else None


def rank_steps(con: duckdb.DuckDBPyConnection, rank: int, range_name: str | None = None) -> RankSteps | None:
    """One rank's steps, by the iterations tool's boundaries on the rank alone (ProfilerStep#N, NVTX, or a kernel
    rhythm; `range_name` as iterations takes it); None when the rank recorded no timed event or lacks the range."""
    with rank_view(con, rank) as cur:
        try:
            method, _, _, spans = boundaries(cur, resolve_scope(cur, ScopedParams(profile=f"rank {rank}")),
                                             range_name, "auto")
        except InvalidRequest:
            return None
        return RankSteps(method, [e - s for s, e in spans], _marker_numbers(cur, method, spans))


StepMatch = Literal["marker number", "order"]  # ProfilerStep#10 on every rank; the k-th step of every rank


@dataclass
class MatchedSteps:
    """The steps every rank with steps has, matched by index across ranks."""
    by: StepMatch | None  # None: no rank has steps
    keys: list[tuple[int, ...]]  # the marker numbers (or 0-based positions) compared, in order
    durations: dict[int, list[int]]  # rank -> its durations of those steps, in the order of keys


def matched_steps(steps: dict[int, RankSteps | None]) -> MatchedSteps:
    """Steps of the same index on every rank with steps: by the numbers in their markers when every such rank's
    steps have them and some number is common to all, else by position (the k-th step of each rank)."""
    stepped = {r: s for r, s in steps.items() if s is not None and s.durations}
    if not stepped:
        return MatchedSteps(None, [], {})
    numbered = {r: dict(zip(s.numbers, s.durations, strict=True)) for r, s in stepped.items() if s.numbers}
    common = set.intersection(*(set(d) for d in numbered.values())) if len(numbered) == len(stepped) else set()
    by: StepMatch = "marker number"
    keyed = numbered
    if not common:
        by = "order"
        keyed = {r: {(k,): d for k, d in enumerate(s.durations)} for r, s in stepped.items()}
        common = set.intersection(*(set(d) for d in keyed.values()))
    keys = sorted(common)
    return MatchedSteps(by, keys, {r: [d[k] for k in keys] for r, d in keyed.items()})


class Histogram(BaseModel):
    metric: str
    low: float
    high: float
    counts: list[int] = Field(description=f"ranks per equal-width bin from low to high ({HISTOGRAM_BINS} bins)")


class KernelSpread(BaseModel):
    kernel: str
    ranks: int
    count: int
    total_ns: int
    min_mean_ns: float
    median_mean_ns: float
    max_mean_ns: float
    spread_pct: float = Field(description="(max - min) / median of the per-rank mean durations")
    slowest_rank: int


def histogram(metric: str, values: list[float]) -> Histogram:
    low, high = min(values), max(values)
    width = (high - low) / HISTOGRAM_BINS
    counts = [0] * HISTOGRAM_BINS
    for v in values:
        counts[min(int((v - low) / width), HISTOGRAM_BINS - 1) if width else 0] += 1
    return Histogram(metric=metric, low=low, high=high, counts=counts)


def kernel_spread(con: duckdb.DuckDBPyConnection) -> list[KernelSpread]:
    return [KernelSpread(kernel=k, ranks=n_ranks, count=count, total_ns=total, min_mean_ns=round(lo, 1),
                         median_mean_ns=round(med, 1), max_mean_ns=round(hi, 1), spread_pct=pct(hi - lo, med),
                         slowest_rank=slowest)
            for k, n_ranks, count, total, lo, med, hi, slowest in
            con.execute(KERNEL_SPREAD_SQL, {"limit": KERNELS_SHOWN}).fetchall()]
