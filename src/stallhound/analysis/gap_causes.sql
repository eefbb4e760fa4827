-- Each gap's cause (judged): queued (also a gap inside a blocking call before a migration the driver issued); for a
-- short gap its blocking call, else its launch; for a longer one jit or profiler (charged only while a load, compile
-- or profiler flush ran: the rest of the gap is judged as below), or alloc, host communication or waits covering
-- most of it, else the blocking call it began in; else what the host did meanwhile (host_cause). The late resume
-- past a blocking call's share, or a jit or profiler gap's time outside its activity (split); the result as labelled.
-- The CTEs ending attribution_sql.LABELLED, after at_start (SPANS); they read gap_host (HOST_SQL).
-- Binds $launch_gap_max, $dominant, $overhead_max, $resume_max.
hosted AS (
  SELECT g.*, h.* EXCLUDE (gap_id), CASE
    WHEN h.alloc_ns >= $dominant * g.duration_ns THEN 'alloc'
    WHEN h.comm_ns >= $dominant * g.duration_ns THEN 'host_comm'
    WHEN h.wait_ns >= $dominant * g.duration_ns THEN 'host_wait' END AS heavy_cause
  FROM at_start g LEFT JOIN gap_host h USING (gap_id)),
judged AS (
  SELECT *, CASE
    WHEN launch_end_ns <= start_ns THEN 'queued'
    WHEN driver AND end_ns <= b_end THEN 'queued'  -- the host sat in a call: the driver's migration, asked before
    WHEN duration_ns <= $launch_gap_max AND blocked_cause IS NOT NULL THEN blocked_cause
    WHEN duration_ns <= $launch_gap_max AND launch_end_ns IS NULL THEN 'host_untraced'
    WHEN duration_ns <= $launch_gap_max THEN
      CASE WHEN tiny THEN 'launch_tiny' ELSE 'launch' END
    WHEN jit_ns > 0 THEN 'jit'
    WHEN profiler_ns > 0 THEN 'profiler'
    ELSE coalesce(heavy_cause, blocked_cause) END AS early_cause, CASE
    WHEN sync_ns >= $dominant * duration_ns THEN 'sync'
    WHEN launch_ns >= $dominant * duration_ns THEN 'launch'
    WHEN cpu_ns - coalesce(api_ns, 0) >= $dominant * duration_ns THEN 'host_cpu'
    WHEN duration_ns <= $overhead_max AND launch_end_ns IS NOT NULL THEN
      CASE WHEN tiny THEN 'launch_tiny' ELSE 'launch' END
    ELSE 'host_untraced' END AS host_cause
  FROM hosted),
split AS (
  SELECT *, coalesce(early_cause, host_cause) AS cause, CASE
    WHEN early_cause = 'jit' THEN duration_ns - jit_ns
    WHEN early_cause = 'profiler' THEN duration_ns - profiler_ns
    WHEN early_cause = blocked_cause AND host_cause <> early_cause THEN greatest(0, end_ns - (b_end + $resume_max))
    ELSE 0 END AS late_ns
  FROM judged),
labelled AS (  -- call: the blocking call (thread, start) that the gap's cause names, as its count counts calls
  SELECT gap_id, device_id, start_ns, end_ns, duration_ns, pid, tid, blocked_in, cause, late_ns,
         CASE WHEN late_ns > 0 AND cause IN ('jit', 'profiler') THEN coalesce(heavy_cause, host_cause)
              WHEN late_ns > 0 THEN host_cause END AS late_cause,
         CASE WHEN cause = blocked_cause THEN [pid, tid, b_start] END AS call FROM split)
