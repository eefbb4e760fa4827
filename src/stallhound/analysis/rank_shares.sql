-- Per rank: its GPU-active window, devices, and the union length of its compute, copy and communication work and
-- of all of it at once (busy), in one ordered pass over each rank's window, as in analysis/shares.py: each
-- interval adds what lies past the furthest end before it on its (rank, device, kind).
-- Binds no parameters: reads the job's meta, kernels, graph_exec, memcpy and memset.
WITH win AS (SELECT rank, gpu_start_ns AS lo, gpu_end_ns AS hi FROM meta WHERE gpu_start_ns < gpu_end_ns),
work AS (
  SELECT x.rank, x.device_id, x.cat, greatest(x.start_ns, w.lo) AS s, least(x.end_ns, w.hi) AS e
  FROM (SELECT rank, device_id, CASE WHEN category = 'nccl' THEN 'communication' ELSE 'compute' END AS cat,
               start_ns, end_ns FROM kernels
        UNION ALL SELECT rank, device_id, 'compute', start_ns, end_ns FROM graph_exec
        UNION ALL SELECT rank, device_id, 'copy', start_ns, end_ns FROM memcpy
        UNION ALL SELECT rank, device_id, 'copy', start_ns, end_ns FROM memset) x JOIN win w USING (rank)
  WHERE x.end_ns > x.start_ns AND x.end_ns > w.lo AND x.start_ns < w.hi),
keyed AS (SELECT rank, device_id, cat, s, e FROM work UNION ALL SELECT rank, device_id, 'busy', s, e FROM work),
reach AS (
  SELECT rank, cat, greatest(0, e - greatest(s, coalesce(max(e) OVER (
           PARTITION BY rank, device_id, cat ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), s)))
         AS adds, device_id FROM keyed)
SELECT w.rank, w.hi - w.lo, count(DISTINCT r.device_id),
       coalesce(sum(r.adds) FILTER (WHERE r.cat = 'compute'), 0),
       coalesce(sum(r.adds) FILTER (WHERE r.cat = 'copy'), 0),
       coalesce(sum(r.adds) FILTER (WHERE r.cat = 'communication'), 0),
       coalesce(sum(r.adds) FILTER (WHERE r.cat = 'busy'), 0)
FROM win w LEFT JOIN reach r USING (rank) GROUP BY w.rank, w.hi, w.lo ORDER BY w.rank
