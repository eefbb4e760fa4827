-- The labelled gaps the totals need: a row of its own for each gap that can be listed, has two causes or can be a
-- pause, the rest summed per device, cause and blocking call, with the gaps the pass only counted (kept); their time by
-- cause (pieces), and the stretches of $gc_min to $gc_max in which the host did nothing traced (host_gaps).
-- CTEs of attribution_sql.TOTALS_SQL, after LABELLED and before the pauses (periodic).
-- Binds $bubble_min, $resume_max, $gc_min, $gc_max and the pass's counts $folded_devices, $folded_causes,
-- $folded_calls, $folded_gaps, $folded_ns.
kept AS MATERIALIZED (  -- a row of its own for each gap that can be listed, has two causes or can be a pause;
  -- the shorter ones (most of them) summed into one row per device, cause and blocking call (gap_id NULL, gaps > 1),
  -- as their count and time are all the totals need
  SELECT gap_id, device_id, cause, blocked_in, count(*) AS gaps, sum(duration_ns) AS ns,
         CASE WHEN gap_id IS NOT NULL THEN any_value(start_ns) END AS start_ns,
         CASE WHEN gap_id IS NOT NULL THEN any_value(end_ns) END AS end_ns,
         CASE WHEN gap_id IS NOT NULL THEN any_value(duration_ns) END AS duration_ns,
         any_value(pid) AS pid, any_value(tid) AS tid, coalesce(any_value(then_ns), 0) AS then_ns,
         any_value(then_cause) AS then_cause, coalesce(any_value(late_ns), 0) AS late_ns,
         any_value(late_cause) AS late_cause, list(DISTINCT call) FILTER (WHERE call IS NOT NULL) AS calls,
         coalesce(sum(duration_ns) FILTER (WHERE held), 0) AS held_ns, coalesce(any_value(lead_ns), 0) AS lead_ns,
         any_value(lead_cause) AS lead_cause, any_value(lead_in) AS lead_in, any_value(lead_call) AS lead_call,
         coalesce(any_value(stall_ns), 0) AS stall_ns
  FROM (SELECT * REPLACE (CASE WHEN duration_ns < least($bubble_min, $gc_min) AND duration_ns <= $resume_max
                                    AND late_ns = 0 AND then_ns = 0 AND lead_ns = 0 AND stall_ns = 0 THEN NULL
                               ELSE gap_id END AS gap_id)
        FROM labelled)
  GROUP BY gap_id, device_id, cause, blocked_in
  UNION ALL  -- the short gaps the pass only counted: queued (gap_pass.Folded) or judged in passing (ShortGaps)
  SELECT NULL, unnest($folded_devices), unnest($folded_causes), unnest($folded_calls), unnest($folded_gaps),
         unnest($folded_ns), NULL, NULL, NULL, NULL, NULL, 0, NULL, 0, NULL, NULL, 0, 0, NULL, NULL, NULL, 0),
pieces0 AS (  -- a gap's time by cause: all of it, or its pieces in order (gap_causes.sql): its cause's, a host
  -- activity's own time after a blocking call's piece (then_ns), the rest (late_ns: a late resume after a blocking
  -- call, or the time the activity did not run), a stall in the copy call the gap ends in (stall_ns), that call's
  -- own piece (lead_ns); held_ns: a held gap's, never split
  SELECT gap_id, device_id, cause, gaps, start_ns, ns - then_ns - late_ns - stall_ns - lead_ns AS ns, duration_ns,
         calls, held_ns, blocked_in FROM kept
  UNION ALL SELECT gap_id, device_id, then_cause, 1, end_ns - lead_ns - stall_ns - late_ns - then_ns, then_ns,
    duration_ns, NULL, 0, NULL FROM kept WHERE then_ns > 0
  UNION ALL SELECT gap_id, device_id, late_cause, 1, end_ns - lead_ns - stall_ns - late_ns, late_ns, duration_ns, NULL,
    0, NULL FROM kept WHERE late_ns > 0
  UNION ALL SELECT gap_id, device_id, 'call_stall', 1, end_ns - lead_ns - stall_ns, stall_ns, duration_ns,
    [lead_call], 0, lead_in FROM kept WHERE stall_ns > 0
  UNION ALL SELECT gap_id, device_id, lead_cause, 1, end_ns - lead_ns, lead_ns, duration_ns, [lead_call], 0, lead_in
  FROM kept WHERE lead_ns > 0),
pieces AS (  -- host_id: the gap's id on its piece with no host activity traced (a gap has one at most)
  SELECT *, CASE WHEN cause IN ('host_untraced', 'host_cpu') THEN gap_id END AS host_id FROM pieces0),
host_gaps AS (  -- stretches of 1 to 100 ms in which the host did nothing traced, a late resume's included
  SELECT host_id AS gap_id, device_id, start_ns, ns AS duration_ns FROM pieces
  WHERE host_id IS NOT NULL AND ns BETWEEN $gc_min AND $gc_max),
