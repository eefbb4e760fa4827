-- The kernel that marks each step on one device: per kernel name, its periods (start to next start) against their
-- median, how steady they are and how much of the time the steady ones fill, and whether it recurs over the
-- capture (the second run's period is the first one, warmup, left out of the time share): the name that marks
-- the steps best.
-- Binds $device, $start, $end, $min_repeats, $tolerance, $min_span_share, $stable_share, $stable_time_share.
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
