-- NCCL collectives matched across devices on arrival (nccl_breakdown's docstring says how): each device's
-- instances of a collective numbered (n), its participants and reference device (parts), each device's best shift
-- against the reference (cost, best), and the complete, simultaneous groups (matched: first and last start, the
-- last device, its transfer time).
-- The start of nccl_arrival's statements; rank_figures.ARRIVAL reads it with ranks for devices.
-- Binds $devices, $start, $end, $max_shift.
WITH n AS (
  SELECT device_id, coalesce(nccl_collective, 'other') AS coll, start_ns, end_ns,
         row_number() OVER (PARTITION BY device_id, coalesce(nccl_collective, 'other') ORDER BY start_ns, end_ns) AS k
  FROM kernels WHERE category = 'nccl' AND device_id IN (SELECT unnest($devices))
    AND end_ns > $start AND start_ns < $end AND end_ns > start_ns),
parts AS (
  SELECT coll, count(*) AS parts, arg_max(device_id, (instances, -device_id)) AS ref
  FROM (SELECT coll, device_id, count(*) AS instances FROM n GROUP BY ALL) GROUP BY coll HAVING count(*) >= 2),
cost AS (
  SELECT d.coll, d.device_id, s.shift, median(abs(d.end_ns - r.end_ns)) AS cost
  FROM n r JOIN parts p ON p.coll = r.coll AND p.ref = r.device_id
  CROSS JOIN (SELECT unnest(range(-$max_shift, $max_shift + 1)) AS shift) s
  JOIN n d ON d.coll = r.coll AND d.k = r.k + s.shift
  GROUP BY ALL),
best AS (SELECT coll, device_id, arg_min(shift, (cost, abs(shift), shift)) AS shift FROM cost GROUP BY ALL),
aligned AS (SELECT n.device_id, n.coll, n.start_ns, n.end_ns, n.k - b.shift AS idx
            FROM n JOIN best b USING (coll, device_id)),
matched AS (
  SELECT a.coll, a.idx, count(*) AS ranks, min(a.start_ns) AS first_ns, max(a.start_ns) AS last_ns,
         arg_max(a.device_id, (a.start_ns, -a.device_id)) AS last_device,
         arg_max(a.end_ns - a.start_ns, (a.start_ns, -a.device_id)) AS transfer_ns
  FROM aligned a JOIN parts p USING (coll)
  GROUP BY a.coll, a.idx, p.parts HAVING count(*) = p.parts AND min(a.end_ns) >= max(a.start_ns))
