-- Idle time per device and cause (totals: gaps, time, the time in gaps of at least $bubble_min and in periodic
-- pauses with their period, for a blocking cause the API whose gaps hold most of it, and the time in held gaps), and
-- the gaps of at least $min_gap (gap_id, device, start_ns, end_ns, cause, blocked_in, pid, tid, then_ns, then_cause,
-- late_ns, late_cause, lead_ns, lead_cause, held, stall_ns): two lists.
-- The end of attribution_sql.TOTALS_SQL, after the pauses (periodic).
-- Binds $bubble_min, $min_gap.
apis AS (  -- by the time of the blocking calls' own pieces
  SELECT device_id, cause, first(blocked_in ORDER BY ns DESC, blocked_in) AS api FROM (
    SELECT device_id, cause, blocked_in, sum(ns) AS ns FROM pieces
    WHERE cause IN ('sync', 'readback', 'pageable_copy', 'small_copy', 'sync_copy', 'call_stall')
      AND blocked_in IS NOT NULL
    GROUP BY ALL)
  GROUP BY ALL),
totals AS (
  SELECT l.device_id, l.cause, sum(l.gaps)::BIGINT AS gaps, sum(l.ns)::BIGINT AS ns,
         coalesce(sum(l.ns) FILTER (WHERE l.duration_ns >= $bubble_min), 0)::BIGINT AS long_ns,
         coalesce(sum(l.ns) FILTER (WHERE p.periodic), 0)::BIGINT AS periodic_ns,
         count(*) FILTER (WHERE p.periodic) AS periodic_gaps,
         median(p.period_ns) FILTER (WHERE p.periodic)::BIGINT AS period_ns, any_value(a.api) AS api,
         list_distinct(flatten(list(l.calls) FILTER (WHERE l.calls IS NOT NULL))) AS calls,
         sum(l.held_ns)::BIGINT AS held_ns
  FROM pieces l LEFT JOIN pauses p ON p.gap_id = l.host_id
  LEFT JOIN apis a ON a.device_id = l.device_id AND a.cause = l.cause
  GROUP BY l.device_id, l.cause)
SELECT (SELECT list(t ORDER BY t.device_id, t.ns DESC, t.cause) FROM totals t),
       (SELECT list({gap_id: gap_id, device: device_id, start_ns: start_ns, end_ns: end_ns, cause: cause,
                     blocked_in: blocked_in, pid: pid, tid: tid, then_ns: then_ns, then_cause: then_cause,
                     late_ns: late_ns, late_cause: late_cause, lead_ns: lead_ns, lead_cause: lead_cause,
                     held: held_ns > 0, stall_ns: stall_ns}
                    ORDER BY gap_id)
        FROM kept WHERE duration_ns >= $min_gap)
