-- What the launching threads did around the long gaps (neither queued nor at most $launch_gap_max): their CUDA
-- calls near those gaps (each with its kind: jit, module, alloc, lazy load, sync, launch, one-time initialisation
-- (init: creating a stream, event or context) or other API), OS-runtime
-- calls (waits, and others: 'os'), NVTX ranges of a known kind (jit, comm, loader), framework operators (ranges of domain $op_domain) when the
-- trace has no CPU data, Python frames that launched no GPU work (python), time on a CPU (scheduler data, else CPU samples), and the profiler's own overhead in their
-- process (profiler_overhead: CUPTI buffer flushes stall the process's CUDA calls), as host_events.
-- A lazy load is a launch call of at least $lazy that launched the first kernel of its name in its process: a
-- long launch of a kernel launched before loads nothing (the driver waited on something else), nor does one whose
-- kernel began before $lazy_after of the call had passed: a load precedes the submission, so the kernel of a lazy
-- load starts near the call's end; one that starts near its start was submitted first (the host's time after it).
-- CTEs of attribution_sql.HOST, after gap_thread (WORK) and before `touch` (intervals.overlaps); they read
-- gap_blocking_calls (CALLS_SQL). Binds $start, $end, $launch_gap_max, $bucket_ns, $jit_calls, $lazy, $lazy_after, $waits, $range_texts, $range_kinds, $op_domain,
-- $init_calls.
long_gaps AS MATERIALIZED (  -- with the end of the blocking call each began in (CALLS_SQL), if any
  SELECT g.probe_id, g.pid, g.tid, g.start_ns, g.end_ns, CASE WHEN g.start_ns < b.until_ns THEN b.end_ns END AS b_end
  FROM (SELECT gap_id AS probe_id, pid, tid, start_ns, end_ns FROM gap_thread
        WHERE tid IS NOT NULL AND duration_ns > $launch_gap_max AND NOT coalesce(launch_end_ns <= start_ns, false)) g
  ASOF LEFT JOIN gap_blocking_calls b ON b.pid = g.pid AND b.tid = g.tid AND g.start_ns >= b.start_ns),
near AS MATERIALIZED (  -- the (thread, bucket) pairs in which `touch` can meet a CUDA call no longer than a bucket:
  -- the calls in none (most of them: long gaps are few, CUDA calls many) are dropped before their kind is decided
  SELECT DISTINCT pid, tid, unnest(range(start_ns // $bucket_ns - 1, (end_ns - 1) // $bucket_ns + 1)) AS bucket
  FROM long_gaps),
sched_on AS (
  SELECT pid, tid, time_ns AS start_ns, next_ns AS end_ns FROM (
    SELECT pid, tid, time_ns, is_sched_in, lead(time_ns) OVER w AS next_ns, lead(is_sched_in) OVER w AS next_in
    FROM sched JOIN threads_in USING (pid, tid) WINDOW w AS (PARTITION BY pid, tid ORDER BY time_ns, is_sched_in))
  WHERE is_sched_in AND NOT next_in AND next_ns > $start AND time_ns < $end),
sample_period AS (
  SELECT coalesce(median(d), 0)::BIGINT AS ns FROM (
    SELECT time_ns - lag(time_ns) OVER (PARTITION BY pid, tid ORDER BY time_ns) AS d
    FROM cpu_samples JOIN threads_in USING (pid, tid)) WHERE d > 0),
range_kinds AS (SELECT unnest($range_texts) AS text, unnest($range_kinds) AS what),  -- kinds(), once per model
long_launched AS MATERIALIZED (  -- the kernels of the long launch calls (few, from the kernels' own launch times, no
  -- join): only they can be lazy loads
  SELECT pid, correlation_id, coalesce(name, short_name) AS name, start_ns FROM kernels
  WHERE launch_end_ns - launch_start_ns >= $lazy AND launch_end_ns > $start AND launch_start_ns < $end
    AND NOT regexp_matches(launch_api, 'Graph')
    AND start_ns - launch_start_ns >= $lazy_after * (launch_end_ns - launch_start_ns)),
firsts AS (  -- the first kernel of each of their names in their process
  SELECT pid, coalesce(name, short_name) AS name, min(start_ns) AS first_ns FROM kernels
  WHERE (pid, coalesce(name, short_name)) IN (SELECT pid, name FROM long_launched) GROUP BY ALL),
lazy_loads AS (  -- the long launches that launched it
  SELECT l.pid, l.correlation_id FROM long_launched l JOIN firsts f USING (pid, name) WHERE l.start_ns = f.first_ns),
process_allocs AS (  -- the allocation calls of every launching thread of a process: a gap the launching thread
  -- began in no blocking call is alloc for the union of them (a framework's other thread, autograd's, frees memory
  -- while this one waits on it)
  SELECT a.pid, a.start_ns, a.end_ns FROM cuda_api a JOIN threads_in USING (pid, tid)
  WHERE a.kind = 'alloc' AND a.end_ns > $start AND a.start_ns < $end),
host_events AS NOT MATERIALIZED (  -- read by both joins of `touch`: recomputed, as written once it spills on the largest exports
  SELECT a.pid, a.tid, CASE WHEN a.kind = 'module' AND regexp_matches(a.name, $jit_calls) THEN 'jit'
                           WHEN a.kind = 'module' THEN 'module' WHEN a.kind = 'alloc' THEN 'alloc'
                           WHEN a.kind = 'launch' AND (a.pid, a.correlation_id) IN (SELECT pid, correlation_id
                                                                                  FROM lazy_loads) THEN 'lazy'
                           WHEN a.kind = 'sync' THEN 'sync'
                           WHEN a.kind = 'other' AND regexp_matches(a.name, $init_calls) THEN 'init'
                           WHEN a.kind IN ('launch', 'graph', 'memcpy', 'memset') THEN 'launch'
                           ELSE 'api' END AS what, a.start_ns, a.end_ns
  FROM cuda_api a WHERE a.end_ns > $start AND a.start_ns < $end AND (a.end_ns - a.start_ns > $bucket_ns
    OR (a.pid, a.tid, a.start_ns // $bucket_ns) IN (SELECT pid, tid, bucket FROM near))
  UNION ALL
  SELECT o.pid, o.tid, CASE WHEN regexp_matches(o.name, $waits) THEN 'wait'  -- ioctl: the GPU driver's own calls
                           WHEN o.name LIKE 'ioctl%' THEN 'api' ELSE 'os' END, o.start_ns, o.end_ns
  FROM os_runtime o JOIN threads_in USING (pid, tid) WHERE o.end_ns > $start AND o.start_ns < $end
  UNION ALL
  SELECT n.pid, n.tid, t.what, n.start_ns, n.end_ns FROM nvtx n JOIN threads_in USING (pid, tid)
  JOIN range_kinds t ON t.text = n.text WHERE n.end_ns > $start AND n.start_ns < $end
  UNION ALL  -- an operator the thread was inside: host work of the framework, where no CPU data says more
  SELECT n.pid, n.tid, 'op', n.start_ns, n.end_ns FROM nvtx n JOIN threads_in USING (pid, tid)
  WHERE n.domain = $op_domain AND n.end_ns > $start AND n.start_ns < $end
    AND NOT EXISTS (SELECT 1 FROM sched LIMIT 1) AND NOT EXISTS (SELECT 1 FROM cpu_samples LIMIT 1)
  UNION ALL  -- Python code the thread ran that launched no GPU work (python_frames): host work where nothing else shows it
  SELECT f.pid, f.tid, 'python', f.start_ns, f.end_ns FROM python_frames f JOIN threads_in USING (pid, tid)
  WHERE f.end_ns > $start AND f.start_ns < $end
  UNION ALL
  SELECT t.pid, t.tid, 'profiler', o.start_ns, o.end_ns FROM profiler_overhead o JOIN threads_in t ON t.pid = o.pid
  WHERE o.end_ns > $start AND o.start_ns < $end
  UNION ALL
  SELECT pid, tid, 'cpu', start_ns, end_ns FROM sched_on
  UNION ALL
  SELECT c.pid, c.tid, 'cpu', c.time_ns, c.time_ns + (SELECT ns FROM sample_period) FROM cpu_samples c
  JOIN threads_in USING (pid, tid) WHERE NOT EXISTS (SELECT 1 FROM sched LIMIT 1)
    AND c.time_ns >= $start AND c.time_ns < $end),
