-- Per step range: until when earlier GPU work still ran (busy_until_ns), the device start of the first GPU work (kernel,
-- copy or memset of a device in scope) its thread launched inside it on its main stream (the stream where that work
-- holds the most GPU time), and the end of the last such work on any stream. Earlier work is what its thread launched
-- before the range began, and work whose launch the trace did not record (queued before the profiler started, as a
-- torch.profiler warmup step's kernels) that began before the range's own main-stream work. Work is matched to the
-- latest range of its thread that began at or before its launch (ASOF), and kept when launched before that range
-- ends. Binds $pids, $tids, $starts, $ends (one entry per range), $devices.
WITH r AS (
  SELECT unnest($pids) AS pid, unnest($tids) AS tid, unnest($starts) AS start_ns, unnest($ends) AS end_ns,
         generate_subscripts($starts, 1) - 1 AS idx),
gpu AS (
  SELECT pid, tid, stream_id, launch_start_ns, start_ns, end_ns FROM kernels WHERE device_id IN (SELECT unnest($devices))
  UNION ALL
  SELECT pid, tid, stream_id, launch_start_ns, start_ns, end_ns FROM memcpy WHERE device_id IN (SELECT unnest($devices))
  UNION ALL
  SELECT pid, tid, stream_id, launch_start_ns, start_ns, end_ns FROM memset WHERE device_id IN (SELECT unnest($devices))),
work AS (
  SELECT * FROM gpu WHERE launch_start_ns < (SELECT max(end_ns) FROM r) AND (pid, tid) IN (SELECT (pid, tid) FROM r)),
launched AS (  -- one row per launch time (a graph launch starts many kernels at once), with the latest end so far
  SELECT pid, tid, launch_start_ns,
         max(max(end_ns)) OVER (PARTITION BY pid, tid ORDER BY launch_start_ns ROWS UNBOUNDED PRECEDING) AS busy_ns
  FROM work GROUP BY pid, tid, launch_start_ns),
unlaunched AS (
  SELECT start_ns, max(max(end_ns)) OVER (ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS busy_ns
  FROM gpu WHERE launch_start_ns IS NULL GROUP BY start_ns),
before AS (
  SELECT r.idx, w.busy_ns FROM r ASOF JOIN launched w
  ON r.pid = w.pid AND r.tid = w.tid AND r.start_ns > w.launch_start_ns),
own AS (
  SELECT r.idx, w.stream_id, w.start_ns, w.end_ns
  FROM work w ASOF JOIN r ON w.pid = r.pid AND w.tid = r.tid AND w.launch_start_ns >= r.start_ns
  WHERE w.launch_start_ns < r.end_ns),
main AS (
  SELECT idx, min(start_ns) AS first_start_ns FROM own GROUP BY idx, stream_id
  QUALIFY row_number() OVER (PARTITION BY idx ORDER BY sum(end_ns - start_ns) DESC, min(start_ns), stream_id) = 1),
inside AS (
  SELECT idx, m.first_start_ns, max(o.end_ns) AS last_end_ns FROM own o JOIN main m USING (idx)
  GROUP BY idx, m.first_start_ns),
queued AS (
  SELECT i.idx, u.busy_ns FROM inside i ASOF JOIN unlaunched u ON i.first_start_ns > u.start_ns)
SELECT idx, greatest(coalesce(b.busy_ns, 0), coalesce(q.busy_ns, 0)), i.first_start_ns, i.last_end_ns
FROM r LEFT JOIN before b USING (idx) LEFT JOIN inside i USING (idx) LEFT JOIN queued q USING (idx)
