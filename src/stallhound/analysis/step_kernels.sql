-- Per device, how many steps ran kernels on it, how many distinct kernel sequences they ran, and the most kernels one
-- step ran. A kernel belongs to the latest step that began at or before its device start (ASOF), while that step lasts;
-- a step's sequence is its kernels' (stream, name) by stream, in start order. Binds $starts, $ends (one entry per step,
-- in time order), $devices.
WITH s AS (SELECT unnest($starts) AS start_ns, unnest($ends) AS end_ns, generate_subscripts($starts, 1) AS step),
k AS (
  SELECT device_id, stream_id, name, start_ns FROM kernels
  WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= (SELECT min(start_ns) FROM s)
    AND start_ns < (SELECT max(end_ns) FROM s)),
per_step AS (
  SELECT k.device_id, s.step, count(*) AS kernels,
         md5(string_agg(coalesce(k.stream_id::VARCHAR, '') || ':' || k.name, '|' ORDER BY k.stream_id, k.start_ns))
           AS sequence
  FROM k ASOF JOIN s ON k.start_ns >= s.start_ns
  WHERE k.start_ns < s.end_ns GROUP BY k.device_id, s.step)
SELECT device_id, count(*)::INTEGER, count(DISTINCT sequence)::INTEGER, max(kernels)::INTEGER FROM per_step
GROUP BY device_id ORDER BY device_id
