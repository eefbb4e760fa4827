"""Exact medians of integer values per group, in memory DuckDB's limit governs.

DuckDB's median aggregate keeps every value of a group in memory outside its limit (and each thread's copy until
they are combined): on the largest exports, the peak memory of a triage. Here each distinct value is counted per
group (a hash aggregate, which DuckDB can spill), those counts are summed per bucket (BUCKET_BITS buckets per power
of two, a non-decreasing function of the value), the one or two buckets holding the middle positions are picked,
and only their values are ranked: a bucket spans under 1/2**BUCKET_BITS of its values, so the sort stays short
however many distinct values the group has. The result is DuckDB's median (quantile_cont at 0.5): the middle value,
or halfway between the two middle ones. Durations of one kernel take few distinct values, which makes this faster
than the aggregate; with every value distinct it is slower, but stays within DuckDB's limit.
"""

from __future__ import annotations

BUCKET_BITS = 6  # 64 buckets per power of two: each spans about 1.1% of its values
TOP_LOG2 = 40  # values from 2**40 (ns: 18 minutes) up share one bucket


def _bucket(v: str) -> str:
    """SQL for the bucket of BIGINT `v`, a non-decreasing function of it: 2**BUCKET_BITS per power of two from 1
    to 2**TOP_LOG2, one below 1 and one from 2**TOP_LOG2 up. Below 2**TOP_LOG2 neighbouring integers' log2 differ by
    over a hundred times the float's rounding, so the floor never orders two values the wrong way."""
    return f"CASE WHEN {v} < 1 THEN -1 ELSE floor(log2(least({v}, {2**TOP_LOG2})) * {2**BUCKET_BITS})::BIGINT END"


def medians(name: str, source: str, keys: tuple[str, ...]) -> str:
    """CTEs ending in `name(<keys>, median)`: per distinct `keys` of `source` (a CTE or table with those columns
    and a BIGINT column v; NULL keys are a group, NULL values are left out), the median of v as a DOUBLE."""
    cols = ", ".join(keys)
    same = " AND ".join(f"p.{k} IS NOT DISTINCT FROM r.{k}" for k in keys)
    return f"""{name}_counts AS MATERIALIZED (  -- each distinct value once: the steps below read these, not the rows
  SELECT *, {_bucket('v')} AS b FROM (
    SELECT {cols}, v, count(*) AS c FROM {source} WHERE v IS NOT NULL GROUP BY ALL)),
{name}_buckets AS (
  SELECT *, sum(c) OVER (PARTITION BY {cols} ORDER BY b ROWS UNBOUNDED PRECEDING) - c AS before,
         sum(c) OVER (PARTITION BY {cols}) AS n
  FROM (SELECT {cols}, b, sum(c) AS c FROM {name}_counts GROUP BY ALL)),
{name}_picked AS (  -- the buckets holding the middle positions (n - 1) // 2 and n // 2, counted from 0
  SELECT {cols}, b, n, min(before) OVER (PARTITION BY {cols}) AS base FROM {name}_buckets
  WHERE before <= n // 2 AND before + c > (n - 1) // 2),
{name}_values AS (  -- the picked buckets' values in order, each with the position after its last row
  SELECT *, base + sum(c) OVER (PARTITION BY {cols} ORDER BY v ROWS UNBOUNDED PRECEDING) AS upto FROM (
    SELECT {", ".join(f"r.{k}" for k in keys)}, r.v, r.c, p.n, p.base
    FROM {name}_counts r JOIN {name}_picked p ON {same} AND p.b = r.b)),
{name} AS (
  SELECT {cols}, lo::DOUBLE + CASE WHEN n % 2 = 0 THEN 0.5::DOUBLE ELSE 0::DOUBLE END * (hi::DOUBLE - lo::DOUBLE)
           AS median
  FROM (SELECT {cols}, any_value(n) AS n, min(v) FILTER (WHERE upto > (n - 1) // 2) AS lo,
               min(v) FILTER (WHERE upto > n // 2) AS hi
        FROM {name}_values GROUP BY ALL))"""
