-- Per (device, direction), the transfer time of the staged pageable copies starting in [$start, $end) that already
-- run at the pinned rate (analysis/pageable_copies.py): uploads whose transfer ran wholly after their call returned
-- (staged: a DMA from the driver's pinned buffer), and copies whose bytes/s reach $share of the best rate of the
-- device's DMAs from pinned memory in that direction lasting $ref_ns or more (pinned copies of the staged size, and
-- those staged uploads).
WITH c AS (
  SELECT device_id, direction, bytes, start_ns, end_ns, duration_ns, launch_end_ns, bytes / nullif(duration_ns, 0) AS rate,
         CASE WHEN 'pageable' IN (src_kind, dst_kind) THEN 'pageable'
              WHEN 'pinned' IN (src_kind, dst_kind) THEN 'pinned' END AS host_kind
  FROM memcpy
  WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end AND STAGED),
d AS (SELECT *, host_kind = 'pageable' AND direction = 'H2D' AND start_ns >= launch_end_ns AS staged_first FROM c),
link AS (
  SELECT device_id, direction, max(rate) AS rate FROM d
  WHERE duration_ns >= $ref_ns AND (host_kind = 'pinned' OR staged_first) GROUP BY ALL)
SELECT device_id, direction,
       coalesce(sum(duration_ns) FILTER (WHERE staged_first OR d.rate >= $share * l.rate), 0)
FROM d LEFT JOIN link l USING (device_id, direction)
WHERE host_kind = 'pageable' GROUP BY ALL
