-- The NVTX step candidates, best first: names that repeat on a thread (repeating), whether their ranges launch GPU
-- work (launches hash-joined to ranges by thread and time bucket: flagged), per thread and per name (threads,
-- candidates), ranked by tier (profiler step, step-like name, other), depth and count; the best one's ranges.
-- The rest of step_boundaries.NVTX_SQL, after named.
-- Binds $start, $end, $devices, $wanted, $min_repeats, $explicit_step, $min_bucket, $min_gpu_share, $profiler_step,
-- $step_names, $limit.
repeating AS MATERIALIZED (
  SELECT *, start_ns - lag(start_ns) OVER (PARTITION BY name, kind, depth, pid, tid ORDER BY start_ns) AS period_ns,
         row_number() OVER () AS rid
  FROM named QUALIFY count(*) OVER (PARTITION BY name, kind, depth, pid, tid)
                     >= CASE WHEN regexp_matches(name, $explicit_step) THEN 1 ELSE $min_repeats END),
launches AS (
  SELECT pid, tid, launch_start_ns AS at_ns FROM kernels
  WHERE device_id IN (SELECT unnest($devices)) AND launch_start_ns >= $start AND launch_start_ns < $end
  UNION ALL
  SELECT pid, tid, launch_start_ns FROM memcpy
  WHERE device_id IN (SELECT unnest($devices)) AND launch_start_ns >= $start AND launch_start_ns < $end
  UNION ALL
  SELECT pid, tid, launch_start_ns FROM memset
  WHERE device_id IN (SELECT unnest($devices)) AND launch_start_ns >= $start AND launch_start_ns < $end
  UNION ALL
  SELECT pid, tid, start_ns FROM cuda_api WHERE kind = 'graph' AND start_ns >= $start AND start_ns < $end),
bucket AS (SELECT greatest($min_bucket, avg(end_ns - start_ns))::BIGINT AS ns FROM repeating),
launched AS (
  SELECT DISTINCT r.rid
  FROM (SELECT rid, pid, tid, start_ns, end_ns,
               unnest(range(start_ns // (SELECT ns FROM bucket), (end_ns - 1) // (SELECT ns FROM bucket) + 1)) AS b
        FROM repeating WHERE end_ns > start_ns) r
  JOIN (SELECT pid, tid, at_ns, at_ns // (SELECT ns FROM bucket) AS b FROM launches) l USING (pid, tid, b)
  WHERE l.at_ns >= r.start_ns AND l.at_ns < r.end_ns),
flagged AS MATERIALIZED (SELECT *, rid IN (SELECT rid FROM launched) AS gpu FROM repeating),
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
