"""The SQL of the idle attribution (analysis/attribution.py): each gap's thread, host activity and cause; the totals."""

from __future__ import annotations

from stallhound.analysis import rules
from stallhound.analysis.intervals import covered, overlaps
from stallhound.model.sql_files import sql_beside

THREADS_SQL = """CREATE TEMP TABLE gap_work_threads AS  -- the work's launching threads, operations per device
WITH ops AS (
  SELECT device_id, pid, tid
  FROM (SELECT device_id, start_ns, end_ns, pid, tid FROM kernels
        UNION ALL SELECT device_id, start_ns, end_ns, pid, tid FROM memcpy
        UNION ALL SELECT device_id, start_ns, end_ns, pid, tid FROM memset
        UNION ALL SELECT device_id, start_ns, end_ns, pid, tid FROM graph_exec)
  WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end AND end_ns > start_ns)
SELECT device_id, pid, tid, count(*) AS n FROM ops WHERE tid IS NOT NULL GROUP BY ALL"""

THREADS = """main_thread AS (  -- who launched the work (gap_work_threads, THREADS_SQL)
  SELECT device_id, first(pid ORDER BY n DESC, pid, tid) AS pid, first(tid ORDER BY n DESC, pid, tid) AS tid
  FROM gap_work_threads GROUP BY device_id),
threads_in AS (SELECT DISTINCT pid, tid FROM gap_work_threads),"""
WORK = THREADS + """
gap_thread AS NOT MATERIALIZED (  -- the gaps (idle_gaps, gap_pass) each with its thread; recomputed for each reader,
  -- which costs less than writing every gap (that spills on the largest exports)
  SELECT g.gap_id, g.device_id, g.start_ns, g.end_ns, g.duration_ns, g.launch_end_ns, g.tiny, g.driver, g.touched,
         g.busy_from_ns, g.run_from_ns, g.run_launch_ns, g.run_idle_ns,
         CASE WHEN g.tid IS NOT NULL THEN g.pid WHEN g.prev_tid IS NOT NULL THEN g.prev_pid ELSE m.pid END AS pid,
         CASE WHEN g.tid IS NOT NULL THEN g.tid WHEN g.prev_tid IS NOT NULL THEN g.prev_tid ELSE m.tid END AS tid
  FROM idle_gaps g LEFT JOIN main_thread m ON m.device_id = g.device_id),"""

# Blocking calls of the launching threads, each with the cause it stands for when the device runs dry inside it (or in
# its wake, CALLS_SQL): synchronize calls, copies that block the host, and allocation or free calls that are not
# stream-ordered (no Async: cudaFree waits for the device, and the host launches nothing while it allocates).
BLOCKING = """
copies AS (  -- the copies a call's cause depends on: a small device-to-host read ($small_read bytes or less), or
  -- pageable (any other copy is a plain copy); staged: pageable and large enough that staging it costs more than its
  -- latency (rules.PAGEABLE_STAGED_BYTES): a smaller one (small_copy) costs the host its latency, not its staging
  SELECT pid, correlation_id, bool_or(direction = 'D2H' AND bytes <= $small_read) AS small_read,
         bool_or('pageable' IN (src_kind, dst_kind)) AS pageable,
         bool_or('pageable' IN (src_kind, dst_kind) AND """ + rules.staged_sql("bytes") + """) AS staged
  FROM memcpy WHERE (direction = 'D2H' AND bytes <= $small_read) OR 'pageable' IN (src_kind, dst_kind) GROUP BY ALL),
thread_calls AS (
  SELECT a.* FROM cuda_api a JOIN threads_in t ON t.pid = a.pid AND t.tid = a.tid
  WHERE (a.kind IN ('sync', 'memcpy') OR (a.kind = 'alloc' AND a.name NOT LIKE '%Async%'))
    AND a.end_ns > $start AND a.start_ns < $end),
reach AS (  -- the (thread, bucket of $follow) in which a call returning can be the one a sync follows
  SELECT DISTINCT pid, tid, start_ns // $follow - unnest([0, 1]) AS bucket FROM thread_calls WHERE kind = 'sync'),
calls0 AS (  -- the syncs, and the copy calls that can block (below) or that a sync can follow: a small share of
  -- the copy calls, so the others are never numbered or joined
  SELECT a.pid, a.tid, a.start_ns, a.end_ns, a.name, a.kind, a.correlation_id,
         coalesce(m.small_read, false) AS small_read,
         coalesce(m.pageable, false) AS pageable, coalesce(m.staged, false) AS staged
  FROM thread_calls a LEFT JOIN copies m ON m.pid = a.pid AND m.correlation_id = a.correlation_id
  WHERE a.kind = 'sync' OR m.pid IS NOT NULL OR a.name NOT LIKE '%Async%'
     OR (a.pid, a.tid, a.end_ns // $follow) IN (SELECT (pid, tid, bucket) FROM reach)),
bcopies AS (
  SELECT pid, tid, start_ns, end_ns, name, correlation_id, CASE
    WHEN small_read AND """ + rules.blocking_copy_sql("name", "pageable") + """ THEN 'readback'
    WHEN staged THEN 'pageable_copy'
    WHEN pageable THEN 'small_copy'
    WHEN name NOT LIKE '%Async%' THEN 'sync_copy' END AS cause
  FROM calls0 WHERE kind = 'memcpy'),
syncs AS (SELECT row_number() OVER () AS sync_id, pid, tid, start_ns, end_ns, name FROM calls0 WHERE kind = 'sync'),
returns AS (  -- the calls' returns in buckets of $follow: one a sync follows is in its start's bucket or the one before
  SELECT pid, tid, start_ns, end_ns, end_ns // $follow AS bucket, CASE WHEN kind = 'sync' THEN 'sync'
    WHEN small_read THEN 'D2H' WHEN staged THEN 'pageable' WHEN pageable THEN 'small' ELSE 'copy' END AS what
  FROM calls0
  WHERE kind <> 'alloc'),
followed AS (  -- what the call that returned last, up to $follow before a sync began, was
  SELECT s.pid, s.tid, s.start_ns, s.end_ns, s.name, arg_max(r.what, [r.end_ns, r.start_ns]) AS what
  FROM (SELECT *, unnest([0, 1]) AS back FROM syncs) s
  LEFT JOIN returns r ON r.pid = s.pid AND r.tid = s.tid AND r.bucket = s.start_ns // $follow - s.back
    AND r.end_ns BETWEEN s.start_ns - $follow AND s.start_ns AND [r.start_ns, r.end_ns] < [s.start_ns, s.end_ns]
  GROUP BY s.sync_id, s.pid, s.tid, s.start_ns, s.end_ns, s.name),
bcalls AS (
  SELECT * FROM bcopies WHERE cause IS NOT NULL
  UNION ALL
  SELECT pid, tid, start_ns, end_ns, name, NULL, 'alloc' FROM calls0 WHERE kind = 'alloc'
  UNION ALL
  SELECT pid, tid, start_ns, end_ns, name, NULL, CASE WHEN what = 'D2H' THEN 'readback'
    WHEN what = 'pageable' THEN 'pageable_copy' WHEN what = 'small' THEN 'small_copy' ELSE 'sync' END FROM followed),
"""
# The blocking calls as the gap starts they stand for: the thread's latest call begun by then, while it lasts (a call
# nested in another ends the outer one's span: until_ns), and for a short gap also in its wake (reach_ns): after it
# returned, until the thread's first kernel launch after it has returned (a launch begun within $resume_max), when
# the work after the gap was launched by then and the device ran work inside the call before the gap (busy_from_ns
# before the call's end: the turnaround that work would have hidden, gap_causes.sql's piece_ns; not asked of a copy
# from host memory, whose turnaround piece_ns does not cap): the queue the call left is empty, so the device idles
# until that launch lands whatever the host does. A thread's spans are disjoint; written once, read by the gap pass
# (ShortGaps) and by the labelling.
CALLS_SQL = "CREATE TEMP TABLE gap_blocking_calls AS WITH " + THREADS + BLOCKING + """
woken AS (  -- the (thread, bucket) pairs in which a launch can begin within $resume_max after a call returned
  SELECT DISTINCT pid, tid, unnest(range(end_ns // $bucket_ns, (end_ns + $resume_max) // $bucket_ns + 1)) AS bucket
  FROM bcalls),
wake_launches AS (
  SELECT a.pid, a.tid, a.start_ns, a.end_ns FROM cuda_api a
  WHERE a.kind IN ('launch', 'graph')
    AND (a.pid, a.tid, a.start_ns // $bucket_ns) IN (SELECT (pid, tid, bucket) FROM woken)),
wakes AS (  -- each call's first launch begun within $resume_max after it returned: the end of its wake
  SELECT b.pid, b.tid, b.start_ns, b.end_ns, l.end_ns AS wake_ns
  FROM (SELECT DISTINCT pid, tid, start_ns, end_ns FROM bcalls) b
  ASOF JOIN wake_launches l ON l.pid = b.pid AND l.tid = b.tid AND b.end_ns <= l.start_ns
  WHERE l.start_ns < b.end_ns + $resume_max),
moved AS (  -- a blocking copy call's transfer: the device it ran on, when it began to move (copy_device, moved_ns) and
  -- for how long it moved (transfer_ns)
  SELECT pid, correlation_id, min(device_id) AS copy_device, min(start_ns) AS moved_ns,
         sum(end_ns - start_ns) AS transfer_ns FROM memcpy
  WHERE (pid, correlation_id) IN (SELECT (pid, correlation_id) FROM bcalls WHERE correlation_id IS NOT NULL)
  GROUP BY ALL)
SELECT * FROM (
  SELECT c.pid, c.tid, c.cause, c.name, c.start_ns, c.end_ns, least(c.end_ns, next_ns) AS until_ns,
         least(greatest(c.end_ns, w.wake_ns), next_ns) AS reach_ns,  -- least and greatest skip a NULL
         m.copy_device, m.moved_ns, m.transfer_ns
  FROM (SELECT *, lead(start_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns) AS next_ns FROM bcalls) c
  LEFT JOIN wakes w USING (pid, tid, start_ns, end_ns)
  LEFT JOIN moved m ON m.pid = c.pid AND m.correlation_id = c.correlation_id)
WHERE until_ns > start_ns"""
SPANS = """
bspans AS (  -- cut in buckets for an equality join of the few calls with the many gaps (an ASOF join sorts every gap)
  SELECT *, unnest(range(start_ns // $bucket_ns, (reach_ns - 1) // $bucket_ns + 1)) AS bucket
  FROM gap_blocking_calls),
spanned AS (  -- each gap with the span its start falls in (a queued gap's shows only in listed gaps), and whether it
  -- holds the gap: it starts inside the call, or for a short gap in its wake, before the work launched by then
  SELECT g.*, b.cause AS b_cause, b.name AS b_name, b.start_ns AS b_start, b.end_ns AS b_end,
         g.start_ns < b.until_ns OR g.duration_ns <= $launch_gap_max AND g.launch_end_ns <= b.reach_ns
           AND (g.run_from_ns < b.end_ns OR g.run_launch_ns <= b.start_ns OR b.cause IN ('pageable_copy', 'small_copy'))
           AS held
  FROM gap_thread g
  LEFT JOIN bspans b ON b.pid = g.pid AND b.tid = g.tid AND b.bucket = CASE
      WHEN g.duration_ns >= $min_gap OR NOT coalesce(g.launch_end_ns <= g.start_ns, false)
      THEN g.start_ns // $bucket_ns END  -- a NULL bucket joins nothing
    AND g.start_ns >= b.start_ns AND g.start_ns < b.reach_ns),  -- held apart: an OR here made the labelling 6x slower
at_start AS (  -- each gap with the blocking call that holds it (blocked_cause, blocked_in, b_start, b_end)
  SELECT * EXCLUDE (b_cause, b_name, b_start, b_end, held), CASE WHEN held THEN b_cause END AS blocked_cause,
         CASE WHEN held THEN b_name END AS blocked_in, CASE WHEN held THEN b_start END AS b_start,
         CASE WHEN held THEN b_end END AS b_end
  FROM spanned),"""

# What the launching threads did during the gaps that are neither queued nor short; for the activities a gap is
# charged to only while they run (allocation, loading or compiling GPU code, communication, a loader's ranges, OS
# waits, the profiler's overhead), one-time initialisation calls (init: charged only where they cover most of a gap,
# gap_causes.sql, so they cut no blocking call's piece) and the framework's operators, the union of their time in it.
ACTIVITIES = "('jit', 'module', 'lazy', 'profiler', 'loader', 'alloc', 'wait', 'comm')"  # claimed for their own time
HOST = sql_beside(__package__, "gap_host_events.sql") + overlaps(
    "touch", "long_gaps", "host_events", "pid, tid", "what") + ",\n" + overlaps(
    "process_touch", "long_gaps", "process_allocs", "pid") + ",\n" + covered("process_alloc", "process_touch") + """,
cuts AS (  -- a gap begun in a blocking call: where the call's piece ends (gap_causes.sql), its return plus the
  -- turnaround, $resume_max at most, while the host does nothing but drive the device: until a claimed activity
  -- (ACTIVITIES) runs (cut_ns), or the thread makes an OS call (printing, I/O: its own work; own_ns)
  SELECT g.probe_id, least(g.b_end + $resume_max, min(greatest(t.start_ns, g.b_end)) FILTER (
           WHERE t.end_ns > g.b_end AND t.what IN """ + ACTIVITIES + """)) AS cut_ns,
         min(t.start_ns) FILTER (WHERE t.start_ns >= g.b_end AND t.what = 'os') AS own_ns
  FROM long_gaps g LEFT JOIN touch t USING (probe_id) WHERE g.b_end IS NOT NULL GROUP BY g.probe_id, g.b_end),
nested AS (  -- per gap, the union of each activity's time in it: nested compile ranges, a load inside a compile
  -- range, nested operators, loader or communication ranges count once (a piece adds what lies past the latest end
  -- before it): the time a gap's cause claims for an activity is never more than the activity's own; a claimed
  -- activity's after the piece of the blocking call the gap began in (cut_ns)
  SELECT probe_id, sum(ns) FILTER (WHERE part = 'jit') AS jit_ns,
         sum(ns) FILTER (WHERE part = 'profiler') AS profiler_ns, sum(ns) FILTER (WHERE part = 'op') AS op_ns,
         sum(ns) FILTER (WHERE part = 'python') AS python_ns,
         sum(ns) FILTER (WHERE part = 'loader') AS loader_ns, sum(ns) FILTER (WHERE part = 'alloc') AS alloc_ns,
         sum(ns) FILTER (WHERE part = 'wait') AS wait_ns, sum(ns) FILTER (WHERE part = 'comm') AS comm_ns,
         sum(ns) FILTER (WHERE part = 'init') AS init_ns
  FROM (SELECT probe_id, part, greatest(0, end_ns - greatest(start_ns, coalesce(max(end_ns) OVER (
          PARTITION BY probe_id, part ORDER BY start_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
          start_ns))) AS ns
        FROM (SELECT t.probe_id, CASE WHEN t.what IN ('module', 'lazy') THEN 'jit' ELSE t.what END AS part,
                     CASE WHEN t.what IN ('op', 'python') THEN t.start_ns
                          ELSE greatest(t.start_ns, coalesce(c.cut_ns, t.start_ns)) END AS start_ns, t.end_ns
              FROM touch t LEFT JOIN cuts c USING (probe_id)
              WHERE t.what IN """ + ACTIVITIES[:-1] + """, 'op', 'python', 'init')))
  GROUP BY probe_id),
host AS (
  SELECT g.probe_id AS gap_id, h.* EXCLUDE (probe_id), n.jit_ns, n.profiler_ns, n.op_ns, n.python_ns, n.loader_ns,
         CASE WHEN g.b_end IS NULL THEN coalesce(pa.ns, n.alloc_ns) ELSE n.alloc_ns END AS alloc_ns, n.wait_ns,
         n.comm_ns, n.init_ns, c.cut_ns, c.own_ns FROM long_gaps g LEFT JOIN (
  SELECT probe_id, sum(end_ns - start_ns) FILTER (WHERE what = 'sync') AS sync_ns,
         sum(end_ns - start_ns) FILTER (WHERE what = 'launch') AS launch_ns,
         sum(end_ns - start_ns) FILTER (WHERE what = 'cpu') AS cpu_ns,
         sum(end_ns - start_ns) FILTER (WHERE what IN ('alloc', 'jit', 'module', 'lazy', 'launch', 'sync', 'api', 'os',
                                                       'init'))
           AS api_ns
  FROM touch GROUP BY probe_id) h USING (probe_id) LEFT JOIN nested n USING (probe_id) LEFT JOIN cuts c USING (probe_id)
  LEFT JOIN process_alloc pa USING (probe_id)),"""

HOST_SQL = "CREATE TEMP TABLE gap_host AS WITH " + WORK + HOST.rstrip().rstrip(",") + """
SELECT * FROM host"""

LABELLED = "WITH " + WORK + SPANS + sql_beside(__package__, "gap_causes.sql")



def periodic(name: str, source: str, keys: str) -> str:
    """CTEs ending in `name(gap_id, <keys>, grp, periodic, period_ns)` for `source(gap_id, <keys>, start_ns,
    duration_ns)`: gaps of similar length (each within $similar of the next shorter one) on a key form a
    group; a group is periodic when it has >= $min_gaps gaps and >= $steady_share of its start-to-start
    intervals lie within $similar of their median (period_ns)."""
    return f"""{name}_chained AS (
  SELECT *, sum(opens) OVER (PARTITION BY {keys} ORDER BY duration_ns, gap_id ROWS UNBOUNDED PRECEDING) AS grp
  FROM (SELECT gap_id, {keys}, start_ns, duration_ns, coalesce(duration_ns > $similar * lag(duration_ns) OVER (
          PARTITION BY {keys} ORDER BY duration_ns, gap_id), true)::INTEGER AS opens FROM {source})),
{name}_spaced AS (
  SELECT *, start_ns - lag(start_ns) OVER (PARTITION BY {keys}, grp ORDER BY start_ns) AS interval_ns
  FROM {name}_chained),
{name}_median AS (
  SELECT *, median(interval_ns) OVER (PARTITION BY {keys}, grp)::BIGINT AS period_ns FROM {name}_spaced),
{name}_steady AS (  -- once per group: a flag per gap over the group's list of intervals grew with its square
  SELECT {keys}, grp, any_value(period_ns) AS period_ns, count(*) >= $min_gaps AND
         count(*) FILTER (WHERE abs(interval_ns - period_ns) <= ($similar - 1) * period_ns)
           >= $steady_share * count(interval_ns) AS periodic
  FROM {name}_median GROUP BY ALL),
{name} AS (
  SELECT s.gap_id, {", ".join(f"s.{k.strip()}" for k in keys.split(","))}, s.grp, st.periodic, st.period_ns
  FROM {name}_spaced s JOIN {name}_steady st USING ({keys}, grp))"""


TOTALS_SQL = (LABELLED + "," + sql_beside(__package__, "idle_pieces.sql")
              + periodic("pauses", "host_gaps", "device_id") + "," + sql_beside(__package__, "idle_totals.sql"))


MAIN_THREAD_SQL = "WITH " + THREADS.rstrip().rstrip(",") + """
SELECT device_id, pid, tid FROM main_thread WHERE pid IS NOT NULL AND tid IS NOT NULL"""
SPANS_SQL = """SELECT pid, tid, cause, name, start_ns, until_ns, reach_ns, end_ns FROM gap_blocking_calls
WHERE pid IS NOT NULL AND tid IS NOT NULL ORDER BY pid, tid, start_ns"""
