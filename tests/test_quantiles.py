"""analysis/quantiles.py against DuckDB's own median aggregate, on random groups (NULL keys and values, ties, a single
value, values below 1 and from 2**40 up, buckets shared by many rows) and against a whole-number check by hand."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from stallhound.analysis import quantiles

DISTRIBUTIONS = {
    "small_ties": lambda rng, n: rng.integers(-5, 5, n),
    "huge": lambda rng, n: rng.integers(0, 2**62, n),
    "lognormal": lambda rng, n: rng.lognormal(10, 3, n).astype(np.int64),
    "one_bucket": lambda rng, n: rng.integers(1000, 1010, n),
    "spread": lambda rng, n: rng.integers(-2**40, 2**55, n),
}


def _medians(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute(f"WITH {quantiles.medians('m', 't', ('g', 'd'))} SELECT g, d, median FROM m ORDER BY ALL"
                       ).fetchall()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", DISTRIBUTIONS)
def test_quantiles_median_equals_duckdbs(kind, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    values = DISTRIBUTIONS[kind](rng, n)
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT unnest($g) AS g, unnest($d)::INTEGER AS d, unnest($v)::BIGINT AS v", {
        "g": rng.integers(0, int(rng.integers(1, 20)), n).tolist(),
        "d": np.where(rng.random(n) < 0.3, None, rng.integers(0, 3, n)).tolist(),
        "v": np.where(rng.random(n) < 0.05, None, values).tolist()})
    expected = con.execute("SELECT g, d, median(v) FROM t GROUP BY ALL HAVING count(v) > 0 ORDER BY ALL").fetchall()
    assert _medians(con) == expected


@pytest.mark.parametrize(("values", "median"), [
    ([7], 7.0), ([1, 2], 1.5), ([3, 1, 2], 2.0), ([0, 0, 5, 9], 2.5), ([2**41, 2**41 + 1], 2**41 + 0.5),
    ([-4, 1], -1.5), ([10, 10, 10, 11], 10.0),
])
def test_quantiles_median_by_hand(values, median):
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1 AS g, NULL::INTEGER AS d, unnest($v)::BIGINT AS v", {"v": values})
    assert _medians(con) == [(1, None, median)]


def test_quantiles_group_of_only_nulls_has_no_row():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 0, NULL::BIGINT), (2, 0, 4)) v(g, d, v)")
    assert _medians(con) == [(2, 0, 4.0)]


def test_quantiles_bucket_is_non_decreasing_and_steps_at_each_power_of_two():
    values = sorted({v for e in range(1, 45) for v in (2**e - 1, 2**e, 2**e + 1)} | {-3, 0, 1})
    con = duckdb.connect()
    bucket = dict(con.execute(f"SELECT v, {quantiles._bucket('v')} FROM unnest($v) t(v)", {"v": values}).fetchall())
    assert [bucket[v] for v in values] == sorted(bucket.values())
    assert bucket[-3] == bucket[0] < bucket[1]
    assert all(bucket[2**e - 1] < bucket[2**e] for e in range(1, 41))
    assert len({bucket[v] for v in values if v >= 2**quantiles.TOP_LOG2}) == 1
