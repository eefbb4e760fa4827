"""The stages of gpu_idle_gaps, each one query with rows read by column name:

find (the gaps of at least min_gap_ns, each with its cause, from analysis/attribution.py) -> group (periodic
groups among them) -> enrich (the `limit` longest: kernels before and after, covering NVTX ranges).
Classifying is the attribution's (cached per model and window); ordering and cutting to the top N is Python's.
"""

from __future__ import annotations

import duckdb

from stallhound.analysis import attribution
from stallhound.analysis.attribution_sql import LABELLED, periodic
from stallhound.analysis.common import Scope, packed, unpacked
from stallhound.model.sql_files import sql_beside

NVTX_NAMES = 3  # innermost ranges reported per gap
KERNEL_HORIZON_NS = 1_000_000_000  # kernel_before/after: the nearest kernel within this distance

FIND_SQL = LABELLED + """
SELECT gap_id, device_id AS device, start_ns, end_ns, cause, blocked_in, pid, tid, then_ns, then_cause, late_ns,
       late_cause, lead_ns, lead_cause, held, stall_ns
FROM labelled WHERE duration_ns >= $min_gap ORDER BY gap_id
"""
_GAPS = """gaps AS (
  SELECT unnest(""" + unpacked("$ids") + """) AS gap_id, unnest(""" + unpacked("$devs") + """) AS device_id,
         unnest(""" + unpacked("$starts") + """) AS start_ns, unnest(""" + unpacked("$ends") + """) AS end_ns,
         unnest(""" + unpacked("$pids") + """) AS pid, unnest(""" + unpacked("$tids") + """) AS tid),
sized AS (SELECT *, end_ns - start_ns AS duration_ns FROM gaps)"""
GROUP_SQL = "WITH " + _GAPS + ",\n" + periodic("groups", "sized", "device_id") + """
SELECT g.device_id AS device, count(*) AS count, avg(s.duration_ns)::BIGINT AS mean_duration_ns,
       any_value(g.period_ns) AS period_ns, sum(s.duration_ns) AS total_ns, min(s.start_ns) AS first_start_ns,
       list(s.gap_id ORDER BY s.gap_id) AS gap_ids
FROM groups g JOIN sized s USING (gap_id, device_id) WHERE g.periodic GROUP BY g.device_id, g.grp
ORDER BY total_ns DESC, device, first_start_ns
"""
ENRICH_SQL = "WITH " + _GAPS + "," + sql_beside(__package__, "gap_neighbours.sql")


def _rows(cursor: duckdb.DuckDBPyConnection) -> list[dict]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _packed(gaps: list[attribution.Gap]) -> dict[str, str]:
    return {name: packed(getattr(g, field) for g in gaps) for name, field in (
        ("ids", "gap_id"), ("devs", "device"), ("starts", "start_ns"), ("ends", "end_ns"), ("pids", "pid"),
        ("tids", "tid"))}


def find(con: duckdb.DuckDBPyConnection, scope: Scope, min_gap_ns: int) -> list[attribution.Gap]:
    """The gaps of at least min_gap_ns in gap_id order: the attribution's long gaps (cached), or for a shorter
    min_gap_ns, its labelling run again for them."""
    if min_gap_ns >= attribution.BUBBLE_MIN_NS:
        return [g for g in attribution.attribute(con, scope).long_gaps if g.end_ns - g.start_ns >= min_gap_ns]
    with attribution.labelled_inputs(con, scope, min_gap_ns):  # shorter gaps are not listed
        params = {**attribution.args(con, scope), "min_gap": min_gap_ns}
        rows = _rows(con.execute(FIND_SQL, attribution.bound(FIND_SQL, params)))
    return [attribution.Gap(**r) for r in rows]


def group(con: duckdb.DuckDBPyConnection, gaps: list[attribution.Gap]) -> list[dict]:
    """The periodic groups among `gaps` (attribution_sql.periodic), costliest first: device, count, mean_duration_ns,
    period_ns, total_ns, first_start_ns and gap_ids."""
    if not gaps:
        return []
    return _rows(con.execute(GROUP_SQL, {**_packed(gaps), **attribution.PERIODIC_ARGS}))


def longest(gaps: list[attribution.Gap], limit: int) -> list[attribution.Gap]:
    """The `limit` longest gaps, ties by device then start."""
    return sorted(gaps, key=lambda g: (g.start_ns - g.end_ns, g.device, g.start_ns))[:limit]


def enrich(con: duckdb.DuckDBPyConnection, gaps: list[attribution.Gap]) -> dict[int, dict]:
    """Per gap id: kernel_before, kernel_after (the nearest within KERNEL_HORIZON_NS on its device) and nvtx (the
    NVTX_NAMES shortest ranges of its host thread covering at least half of it)."""
    if not gaps:
        return {}
    rows = _rows(con.execute(ENRICH_SQL, {**_packed(gaps), "horizon": KERNEL_HORIZON_NS,
                                          "nvtx_names": NVTX_NAMES}))
    return {r.pop("gap_id"): r for r in rows}
