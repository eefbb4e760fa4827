-- Every softmax kernel in scope (not a log-softmax: that one ends a classifier's loss, never attention) with the
-- kernels up to $reach places before and after it on its stream, ordered by start; and per device, its kernel time.
WITH k AS (
  SELECT device_id, stream_id, duration_ns, coalesce(name, short_name, '') AS name,
         coalesce(short_name, name, '') AS short,
         row_number() OVER (PARTITION BY device_id, stream_id ORDER BY start_ns, end_ns) AS rn
  FROM kernels
  WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end),
s AS (
  SELECT device_id, stream_id, rn FROM k
  WHERE regexp_matches(name, '(?i)softmax') AND NOT regexp_matches(name, '(?i)log_?softmax'))
SELECT s.device_id, s.stream_id, s.rn, k.rn - s.rn AS at, k.name, k.short, k.duration_ns
FROM s JOIN k ON k.device_id = s.device_id AND k.stream_id = s.stream_id AND k.rn BETWEEN s.rn - $reach AND s.rn + $reach
ORDER BY 1, 2, 3, 4
