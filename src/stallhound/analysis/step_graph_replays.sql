-- CUDA graph replays in the window, per launching thread and device: their GPU spans in time order, their count, the
-- launch call's name and the share of the device's GPU time their work holds. A replay is the kernels one graph
-- launch ran (kernels of one launch share its correlation id: Kineto's and nsys' node-level graph trace) or one
-- graph_exec row (nsys' whole-graph trace, whose kernels have no rows); it counts when all of it lies in the window.
-- GPU time: summed durations of kernels, graph executions, copies and memsets. Binds $start, $end, $devices,
-- $graph_launch (regex on the launch call's name).
WITH replays AS (
  SELECT device_id, pid, tid, any_value(launch_api) AS api, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
         sum(duration_ns) AS work_ns
  FROM kernels
  WHERE regexp_matches(coalesce(launch_api, ''), $graph_launch) AND device_id IN (SELECT unnest($devices))
  GROUP BY device_id, pid, tid, correlation_id
  HAVING min(start_ns) >= $start AND max(end_ns) <= $end
  UNION ALL
  SELECT device_id, pid, tid, coalesce(launch_api, 'graph'), start_ns, end_ns, duration_ns FROM graph_exec
  WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND end_ns <= $end),
device_work AS (
  SELECT device_id, sum(duration_ns) AS work_ns FROM (
    SELECT device_id, start_ns, end_ns, duration_ns FROM kernels
    UNION ALL SELECT device_id, start_ns, end_ns, duration_ns FROM graph_exec
    UNION ALL SELECT device_id, start_ns, end_ns, duration_ns FROM memcpy
    UNION ALL SELECT device_id, start_ns, end_ns, duration_ns FROM memset)
  WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND end_ns <= $end
  GROUP BY device_id)
SELECT r.pid, r.tid, r.device_id, count(*) AS replays, min(r.api) AS api,
       sum(r.work_ns) / any_value(d.work_ns) AS share, list([r.start_ns, r.end_ns] ORDER BY r.start_ns) AS spans
FROM replays r JOIN device_work d USING (device_id)
GROUP BY r.pid, r.tid, r.device_id
ORDER BY share DESC, r.device_id, r.pid, r.tid
