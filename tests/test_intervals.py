"""The bucketed overlap join (analysis/intervals.py overlaps, covered) against a brute-force sweep over random probes
and events, short and long against the bucket, on two keys."""

from __future__ import annotations

import random

import duckdb
import pytest

from stallhound.analysis.intervals import covered, overlaps

BUCKET_NS = 100


def _intervals(rng: random.Random, count: int, longest: int) -> list[tuple[int, int, int]]:
    """(key, start, end) with lengths from 1 to `longest`, many shorter than a bucket, some spanning several."""
    rows = []
    for _ in range(count):
        start = rng.randrange(2000)
        rows.append((rng.choice([1, 2]), start, start + rng.randint(1, longest)))
    return rows


def _brute(probes: list[tuple], events: list[tuple]) -> tuple[dict, dict]:
    """Per probe id: the summed overlap with each event of its key, by payload; the length of their union."""
    summed: dict[tuple[int, str], int] = {}
    union: dict[int, int] = {}
    for pid, (key, ps, pe) in enumerate(probes):
        covered_ns = set()
        for what, (ekey, es, ee) in events:
            lo, hi = max(ps, es), min(pe, ee)
            if ekey == key and hi > lo:
                summed[(pid, what)] = summed.get((pid, what), 0) + hi - lo
                covered_ns.update(range(lo, hi))
        if covered_ns:
            union[pid] = len(covered_ns)
    return summed, union


@pytest.mark.parametrize("seed", range(8))
def test_intervals_overlaps_and_covered_equal_a_brute_force_sweep(seed):
    rng = random.Random(seed)
    probes = _intervals(rng, 40, 500)
    events = [(rng.choice(["a", "b"]), e) for e in _intervals(rng, 200, 350)]
    con = duckdb.connect()
    con.execute("CREATE TABLE probes (probe_id INTEGER, k INTEGER, start_ns BIGINT, end_ns BIGINT)")
    con.executemany("INSERT INTO probes VALUES (?, ?, ?, ?)", [(i, *p) for i, p in enumerate(probes)])
    con.execute("CREATE TABLE events (k INTEGER, start_ns BIGINT, end_ns BIGINT, what VARCHAR)")
    con.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", [(*e, what) for what, e in events])
    sql = "WITH " + overlaps("hits", "probes", "events", "k", "what") + ",\n" + covered("cov", "hits")
    summed = dict(((p, w), int(ns)) for p, w, ns in con.execute(
        sql + " SELECT probe_id, what, sum(end_ns - start_ns) FROM hits GROUP BY ALL", {"bucket_ns": BUCKET_NS}
    ).fetchall())
    union = dict(con.execute(sql + " SELECT probe_id, ns FROM cov", {"bucket_ns": BUCKET_NS}).fetchall())
    assert (summed, union) == _brute(probes, events)
    assert any(e - s > BUCKET_NS for _, (_, s, e) in events) and any(e - s <= BUCKET_NS for _, (_, s, e) in events)
