-- Each gap's cause (judged): queued (also a gap inside a blocking call before a migration the driver issued); host_fault
-- between two migrations a host thread's touch caused, up to $fault_max; for a short gap its blocking call (or the one
-- in whose wake it began), else its launch; for a longer one alloc, host communication, a data loader's ranges or OS
-- waits covering most of it (a load of 0.5 ms does not explain a second of allocation), else jit or profiler when a
-- load, compile or profiler flush ran in it, else init when calls creating a stream, event or context cover most of
-- a gap of $init_min or more, else host communication run in it at all (its own time), else the
-- blocking call it began in; else what the host did meanwhile
-- (host_cause; before a late launch, one op's overhead: alloc when allocating is the most of it seen). A host
-- activity claims only its own time in the gap (the union of its events there, gap_host): a finding never claims more
-- than the time of the events it is about. So a gap is cut in up to three pieces that never share nanoseconds
-- (split): the blocking call it began in (piece_ns: its in-call idle and up to $resume_max of turnaround, while the
-- host does nothing but drive the device: own_ns at an OS call, gap_host's cut_ns at the activity claimed after it;
-- and no longer than the device's work in its run inside the call before the gap (from busy_from_ns, less the run's
-- idle run_idle_ns, which may lie before the call: never more than the work): with the call gone, the
-- host's turnaround, the next launch's latency included, would overlap only the work the call waited for, past it
-- the device idles anyway; so a call claims at most its own time. Not a copy from host memory (pageable_copy,
-- small_copy): the copy is itself the work, not a wait on earlier work, and its turnaround is the cost of issuing
-- such copies one by one); the activity's own time after that (one piece with the call's when it is of the call's
-- kind)
-- (then_ns, then_cause); the rest (late_ns, late_cause: host_cause). A blocking call's late resume with no
-- activity, likewise the rest. A short gap is cut at its call's piece too, and where an allocation call of its
-- thread begins in it when the call allocates nothing (short_allocs): the allocation calls' own time (then), the
-- late launch after them (late). The result as labelled.
-- Before all that, a held gap: one of $held_min or more that a blocking copy call on any thread spans to its end, for
-- most of it, whose transfer runs on the gap's device only after the gap, while the work after the gap had been
-- launched before the call began (or by no traced call): the device waited on work the trace does not show (another
-- stream's event, another process or rank) and the host waited in the copy for it; the gap is the copy's cause, held.
-- A synchronize call names no device and moves nothing, so a queued gap inside one stays queued (the device may wait
-- on another device the host waits for too).
-- Last, a gap of $held_min or more (judged one by one) that ends inside a blocking copy call its thread began in it,
-- the call's transfer on the gap's device starting only at its end (lead): the device idled while the host sat in that
-- call, before it moved anything (a pageable copy's staging through the driver's buffer, a synchronous copy's
-- latency): that time, up to the rest of the gap (the late piece, or the whole gap judged by what the host did) and
-- up to the copy's own transfer time, is the copy's cause (lead_ns, lead_cause), not the host's. Staging paces a
-- pageable transfer (the DMA moves what the driver has staged), so staging all its bytes takes about its transfer's
-- time: a longer wait before the first byte moves is not the copy's size (a first use's one-off setup, page faults
-- of memory never touched), and what exceeds it stays the host's as the rest of the gap. The same bounds a synchronous
-- copy's latency: the few microseconds it may exceed a small transfer's time are left to the host. Where the host sits
-- in the call $stall_min or more past that time (stalled_ns: the call's time in the gap), it launched nothing and moved
-- nothing: that excess, out of the same rest, is a stall inside the call (stall_ns, cause call_stall: the driver's
-- work at a first use, faults on untouched memory, a lock; the trace cannot show which), and the rest of the gap
-- before the call is judged by what the host did there, not by the call's time.
-- The CTEs ending attribution_sql.LABELLED, after at_start (SPANS); they read gap_host (HOST_SQL).
-- Binds $launch_gap_max, $dominant, $overhead_max, $resume_max, $held_min, $fault_max, $bucket_ns, $init_min,
-- $stall_min.
held AS (
  SELECT g.gap_id, b.cause AS h_cause, b.name AS h_name, b.pid AS h_pid, b.tid AS h_tid, b.start_ns AS h_start
  FROM idle_gaps g JOIN gap_blocking_calls b ON b.copy_device = g.device_id AND b.start_ns < g.end_ns
    AND b.end_ns >= g.end_ns AND b.moved_ns >= g.end_ns
  WHERE g.duration_ns >= $held_min AND NOT g.driver AND coalesce(g.launch_end_ns <= b.start_ns, true)
    AND g.end_ns - greatest(g.start_ns, b.start_ns) >= $dominant * g.duration_ns
  QUALIFY row_number() OVER (PARTITION BY g.gap_id ORDER BY b.start_ns, b.pid, b.tid) = 1),
lead AS (  -- each long gap's thread's latest blocking call begun before its end: a copy begun in the gap and
  -- spanning its end, whose transfer on the gap's device starts only then
  SELECT g.gap_id, b.cause AS l_cause, b.name AS l_name, b.start_ns AS l_start, b.transfer_ns AS l_transfer,
         CASE WHEN g.end_ns - b.start_ns - coalesce(b.transfer_ns, 0) >= $stall_min THEN g.end_ns - b.start_ns
              ELSE 0 END AS l_stalled
  FROM (SELECT gap_id, device_id, pid, tid, start_ns, end_ns FROM at_start WHERE duration_ns >= $held_min) g
  ASOF JOIN gap_blocking_calls b ON b.pid = g.pid AND b.tid = g.tid AND b.start_ns < g.end_ns
  WHERE b.start_ns > g.start_ns AND b.end_ns >= g.end_ns AND b.copy_device = g.device_id AND b.moved_ns >= g.end_ns
    AND b.cause IN ('pageable_copy', 'small_copy', 'sync_copy', 'readback')),
short_allocs AS (  -- a short gap begun in a blocking call that allocates nothing: the thread's allocation calls that
  -- begin in it after that call, each for its own time (until the thread's next blocking call), as ShortGaps finds them
  SELECT g.gap_id, min(a.start_ns) AS alloc_at, sum(least(a.until_ns, g.end_ns) - a.start_ns) AS s_alloc_ns
  FROM (SELECT gap_id, pid, tid, end_ns, b_start,
               unnest(range(start_ns // $bucket_ns, (end_ns - 1) // $bucket_ns + 1)) AS bucket
        FROM at_start WHERE duration_ns <= $launch_gap_max AND blocked_cause <> 'alloc') g
  JOIN (SELECT *, start_ns // $bucket_ns AS bucket FROM gap_blocking_calls WHERE cause = 'alloc') a
    ON a.pid = g.pid AND a.tid = g.tid AND a.bucket = g.bucket AND a.start_ns > g.b_start AND a.start_ns < g.end_ns
  GROUP BY g.gap_id),
judged AS (
  SELECT g.*, sa.alloc_at, sa.s_alloc_ns, h.jit_ns, h.profiler_ns, hd.h_cause IS NOT NULL AS held, hd.h_name,
         hd.h_pid, hd.h_tid, hd.h_start, l.l_cause, l.l_name, l.l_start, l.l_transfer,
         coalesce(l.l_stalled, 0) AS stalled_ns,
         least(g.end_ns, greatest(g.start_ns, g.b_end)
           + least(greatest(0, least(g.end_ns, g.b_end + $resume_max, h.own_ns) - greatest(g.start_ns, g.b_end)),
           CASE WHEN g.blocked_cause NOT IN ('pageable_copy', 'small_copy') THEN greatest(0, least(g.start_ns, g.b_end)
             - least(greatest(g.b_start, g.busy_from_ns), greatest(g.b_start, CASE WHEN g.run_launch_ns > g.b_start
               THEN g.run_from_ns END) + g.run_idle_ns)) END), sa.alloc_at) - g.start_ns
           AS piece_ns,  -- the blocking call's piece (above; least skips a NULL: a host copy's turnaround, uncapped)
  CASE
    WHEN hd.h_cause IS NOT NULL THEN hd.h_cause
    WHEN g.launch_end_ns <= g.start_ns THEN 'queued'
    WHEN g.driver AND g.end_ns <= g.b_end THEN 'queued'  -- the host sat in a call: the driver's migration, asked before
    WHEN g.touched AND g.duration_ns <= $fault_max THEN 'host_fault'  -- between two pages the host faulted in
    WHEN g.duration_ns <= $launch_gap_max AND g.blocked_cause IS NOT NULL THEN g.blocked_cause
    WHEN g.duration_ns <= $launch_gap_max AND g.launch_end_ns IS NULL THEN 'host_untraced'
    WHEN g.duration_ns <= $launch_gap_max THEN
      CASE WHEN g.tiny THEN 'launch_tiny' ELSE 'launch' END
    WHEN h.alloc_ns + CASE WHEN g.blocked_cause = 'alloc' THEN greatest(0, least(g.b_end, g.end_ns) - g.start_ns)
                           ELSE 0 END >= $dominant * g.duration_ns THEN 'alloc'  -- with the alloc call it began in
    WHEN h.comm_ns >= $dominant * g.duration_ns THEN 'host_comm'
    WHEN h.loader_ns >= $dominant * g.duration_ns THEN 'input_wait'
    WHEN h.wait_ns >= $dominant * g.duration_ns THEN 'host_wait'
    WHEN h.jit_ns > 0 THEN 'jit'
    WHEN h.profiler_ns > 0 THEN 'profiler'
    WHEN g.duration_ns >= $init_min AND h.init_ns >= $dominant * g.duration_ns THEN 'init'  -- a stream, event or
    -- context created: one-time setup where it does not recur (idle_causes), only where it is most of a long gap
    WHEN h.comm_ns > 0 THEN 'host_comm'  -- under half the gap too: the host communicated, for that time, not computed
    WHEN g.blocked_cause IS NOT NULL THEN g.blocked_cause END AS early_cause, CASE
    WHEN h.sync_ns >= $dominant * (g.duration_ns - stalled_ns) THEN 'sync'  -- outside a stalled call
    WHEN h.launch_ns - stalled_ns >= $dominant * (g.duration_ns - stalled_ns) THEN 'launch'
    WHEN h.cpu_ns - coalesce(h.api_ns, 0) >= $dominant * (g.duration_ns - stalled_ns) THEN 'host_cpu'
    WHEN g.duration_ns <= $overhead_max AND g.launch_end_ns IS NOT NULL THEN CASE  -- one op's overhead
      WHEN g.tiny THEN 'launch_tiny' ELSE 'launch' END
    WHEN h.op_ns - coalesce(h.api_ns, 0) >= $dominant * (g.duration_ns - stalled_ns) THEN 'host_op'  -- past one op
    WHEN h.python_ns - coalesce(h.api_ns, 0) >= $dominant * (g.duration_ns - stalled_ns) THEN 'host_python'  -- frames
    ELSE 'host_untraced' END AS host_cause,
    g.duration_ns > $launch_gap_max AND g.duration_ns <= $overhead_max AND g.launch_end_ns IS NOT NULL
      AND h.alloc_ns >= greatest(coalesce(h.launch_ns, 0), coalesce(h.sync_ns, 0),
                                 coalesce(h.cpu_ns, 0) - coalesce(h.api_ns, 0)) AS op_alloc,  -- the op's overhead
      -- was its allocation: allocating is the most the host is seen doing in it
    h.alloc_ns, h.comm_ns, h.loader_ns, h.wait_ns, h.init_ns, h.cut_ns, h.own_ns
  FROM at_start g LEFT JOIN gap_host h USING (gap_id) LEFT JOIN held hd USING (gap_id)
  LEFT JOIN short_allocs sa USING (gap_id) LEFT JOIN lead l USING (gap_id)),
activity AS (  -- a longer gap's host activity (one claimed for its own time), that time, and the blocking call's piece
  -- before it: the call's in-call idle and up to $resume_max of turnaround, when the call is not the activity's kind
  SELECT *, CASE WHEN act IS NULL OR held OR blocked_cause IS NULL THEN 0
                 ELSE least(piece_ns, cut_ns - start_ns) END AS call_ns  -- cut at the claimed activity
  FROM (SELECT *, CASE WHEN held OR duration_ns <= $launch_gap_max THEN NULL
                       WHEN early_cause IN ('host_comm', 'input_wait', 'host_wait', 'jit', 'profiler', 'init')
                         THEN early_cause
                       WHEN early_cause = 'alloc' AND alloc_ns + CASE WHEN blocked_cause = 'alloc' THEN greatest(0,
                         least(b_end, end_ns) - start_ns) ELSE 0 END >= $dominant * duration_ns THEN 'alloc'  -- covering
                       -- most of it (alloc_ns: after the call's piece), not only the blocking alloc call it began in
                       WHEN early_cause IS NULL AND op_alloc THEN 'alloc' END AS act,
                  CASE early_cause WHEN 'host_comm' THEN comm_ns WHEN 'input_wait' THEN loader_ns
                    WHEN 'host_wait' THEN wait_ns WHEN 'jit' THEN jit_ns WHEN 'profiler' THEN profiler_ns
                    WHEN 'init' THEN init_ns
                    ELSE coalesce(alloc_ns, 0) END AS act_ns FROM judged)),
split AS (
  SELECT *, CASE WHEN call_ns > 0 THEN blocked_cause ELSE coalesce(act, early_cause, host_cause) END AS cause,
         CASE WHEN call_ns > 0 AND act <> blocked_cause THEN act WHEN short_split THEN 'alloc' END AS then_cause,
         CASE WHEN call_ns > 0 AND act <> blocked_cause THEN least(act_ns, duration_ns - call_ns)  -- of the call's
              WHEN short_split THEN coalesce(s_alloc_ns, 0) ELSE 0 END AS then_ns,  -- kind: one piece
         CASE
    WHEN short_split THEN duration_ns - piece_ns - coalesce(s_alloc_ns, 0)  -- the rest: the late launch
    WHEN act = 'alloc' AND blocked_cause = 'alloc' THEN greatest(0, duration_ns - (least(b_end, end_ns) - start_ns)
      - act_ns - $resume_max)  -- begun in an alloc call: the calls' own time in it and one turnaround after them
    WHEN act IS NOT NULL THEN duration_ns - call_ns - least(act_ns, duration_ns - call_ns)
    WHEN early_cause = blocked_cause AND host_cause <> early_cause AND duration_ns > $launch_gap_max AND NOT held
      THEN duration_ns - piece_ns  -- no claimed activity: the turnaround runs on through unclaimed ones
    ELSE 0 END AS late_ns
  FROM (SELECT *, duration_ns <= $launch_gap_max AND early_cause = blocked_cause AND piece_ns < duration_ns
                  AS short_split FROM activity)),  -- a short gap past its call's piece: allocation, late launch
led AS (  -- the lead copy call's piece: from its start to the gap's end, taken from the rest of the gap (room: the late
  -- piece, or a gap judged whole by what the host did), never more than that rest nor than the copy's transfer time;
  -- a stalled call's excess over it, out of the same rest (stall_ns)
  SELECT *, CASE WHEN stalled_ns > 0 THEN least(stalled_ns, room) - lead_ns ELSE 0 END AS stall_ns
  FROM (SELECT *, CASE WHEN l_cause IS NULL THEN 0 ELSE least(end_ns - l_start, l_transfer, room) END AS lead_ns
        FROM (SELECT *, CASE WHEN late_ns > 0 THEN late_ns WHEN then_ns = 0 AND early_cause IS NULL AND act IS NULL
                             THEN duration_ns ELSE 0 END AS room FROM split))),
labelled AS (  -- call: the blocking call (thread, start) that the gap's cause names, as its count counts calls; a held
  -- gap is the copy's thread's; lead_call: the lead copy call's
  SELECT gap_id, device_id, start_ns, end_ns, duration_ns, CASE WHEN held THEN h_pid ELSE pid END AS pid,
         CASE WHEN held THEN h_tid ELSE tid END AS tid, CASE WHEN held THEN h_name ELSE blocked_in END AS blocked_in,
         cause, then_ns, CASE WHEN then_ns > 0 THEN then_cause END AS then_cause,
         late_ns - least(lead_ns + stall_ns, late_ns) AS late_ns,
         CASE WHEN late_ns > lead_ns + stall_ns THEN host_cause END AS late_cause, stall_ns,
         CASE WHEN held THEN [h_pid, h_tid, h_start] WHEN cause = blocked_cause THEN [pid, tid, b_start] END AS call,
         held, lead_ns, CASE WHEN lead_ns > 0 THEN l_cause END AS lead_cause,
         CASE WHEN lead_ns > 0 THEN l_name END AS lead_in, CASE WHEN lead_ns > 0 THEN [pid, tid, l_start] END AS lead_call
  FROM led)
