-- The span and the host time of a window's work, taken on $devices and [$lo, $hi) as in work_kernels.sql:
-- the first GPU start and the last GPU end of its kernels, copies, memsets and graph executions; and on the host,
-- the start of its first kernel launch call to the end of its last, less the time in that stretch the launching
-- threads spent inside synchronizing CUDA calls (kind 'sync'; overlapping calls count once): the host's own time
-- issuing the work (NULL when no launch call was recorded).
WITH work AS (
  SELECT 'kernel' AS kind, device_id, pid, tid, start_ns, end_ns, launch_start_ns, launch_end_ns FROM kernels
  UNION ALL SELECT 'copy', device_id, pid, tid, start_ns, end_ns, launch_start_ns, launch_end_ns FROM memcpy
  UNION ALL SELECT 'memset', device_id, pid, tid, start_ns, end_ns, launch_start_ns, launch_end_ns FROM memset
  UNION ALL SELECT 'graph', device_id, pid, tid, start_ns, end_ns, launch_start_ns, launch_end_ns FROM graph_exec),
ours AS (
  SELECT * FROM (SELECT *, CASE WHEN $by_launch THEN coalesce(launch_start_ns, start_ns) ELSE start_ns END AS placed_ns
                 FROM work)
  WHERE placed_ns >= $lo AND placed_ns < $hi AND device_id IN (SELECT unnest($devices))),
launches AS (
  SELECT pid, tid, launch_start_ns, launch_end_ns FROM ours
  WHERE kind = 'kernel' AND launch_start_ns IS NOT NULL AND launch_end_ns IS NOT NULL AND tid IS NOT NULL),
stretch AS (SELECT min(launch_start_ns) AS lo, max(launch_end_ns) AS hi FROM launches),
syncs AS (
  SELECT greatest(a.start_ns, s.lo) AS start_ns, least(a.end_ns, s.hi) AS end_ns
  FROM cuda_api a, stretch s
  WHERE a.kind = 'sync' AND a.start_ns < s.hi AND a.end_ns > s.lo
    AND (a.pid, a.tid) IN (SELECT DISTINCT pid, tid FROM launches)),
blocked AS (  -- in start order, the part of a call past the latest end before it is new blocked time
  SELECT end_ns - greatest(start_ns, coalesce(max(end_ns) OVER (
           ORDER BY start_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns)) AS ns
  FROM syncs)
SELECT (SELECT min(start_ns) FROM ours), (SELECT max(end_ns) FROM ours),
       (SELECT hi - lo FROM stretch) - (SELECT coalesce(sum(greatest(ns, 0)), 0) FROM blocked)::BIGINT
