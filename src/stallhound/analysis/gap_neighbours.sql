-- For each listed gap: the kernel before and after it on its device (within $horizon ns), and the innermost NVTX
-- ranges of its thread that cover half of it (at most $nvtx_names).
-- The rest of gap_stages.ENRICH_SQL, after its gaps and sized CTEs (_GAPS), which bind the packed gaps.
-- Binds $horizon, $nvtx_names.
klanes AS (SELECT device_id, short_name, start_ns, end_ns FROM kernels
           WHERE device_id IN (SELECT device_id FROM gaps)),
before AS (
  SELECT t.gap_id, arg_max(k.short_name, k.end_ns) AS short_name
  FROM (SELECT *, unnest([start_ns // $horizon - 1, start_ns // $horizon]) AS bucket FROM gaps) t
  JOIN (SELECT *, end_ns // $horizon AS bucket FROM klanes) k
    ON k.device_id = t.device_id AND k.bucket = t.bucket AND k.end_ns <= t.start_ns
  GROUP BY t.gap_id),
after AS (
  SELECT t.gap_id, arg_min(k.short_name, k.start_ns) AS short_name
  FROM (SELECT *, unnest([end_ns // $horizon, end_ns // $horizon + 1]) AS bucket FROM gaps) t
  JOIN (SELECT *, start_ns // $horizon AS bucket FROM klanes) k
    ON k.device_id = t.device_id AND k.bucket = t.bucket AND k.start_ns >= t.end_ns
  GROUP BY t.gap_id),
long_ranges AS (  -- only a range half as long as the shortest gap listed can cover half of one
  SELECT pid, tid, text, start_ns, end_ns, duration_ns FROM nvtx
  WHERE duration_ns >= (SELECT min(duration_ns) FROM sized) // 2 AND (pid, tid) IN (SELECT (pid, tid) FROM gaps)),
ranges AS (
  SELECT t.gap_id, list(n.text ORDER BY n.duration_ns, n.text)[1:$nvtx_names] AS names
  FROM sized t JOIN long_ranges n ON n.pid = t.pid AND n.tid = t.tid AND n.duration_ns >= t.duration_ns // 2
   AND least(n.end_ns, t.end_ns) - greatest(n.start_ns, t.start_ns) >= t.duration_ns / 2
  GROUP BY t.gap_id)
SELECT t.gap_id, b.short_name AS kernel_before, a.short_name AS kernel_after, coalesce(r.names, []) AS nvtx
FROM gaps t LEFT JOIN before b USING (gap_id) LEFT JOIN after a USING (gap_id) LEFT JOIN ranges r USING (gap_id)
ORDER BY t.gap_id
