"""The SQL of the idle attribution (analysis/attribution.py): each gap's thread, host activity and cause; the totals."""

from __future__ import annotations

from stallhound.analysis import rules
from stallhound.analysis.intervals import overlaps

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
gap_thread AS NOT MATERIALIZED (  -- the gaps (idle_gaps, gap_pass) each with its thread; twice recomputed costs less
  -- than writing 11 M gaps (spilled on 10 GB)
  SELECT g.gap_id, g.device_id, g.start_ns, g.end_ns, g.duration_ns, g.launch_end_ns, g.tiny,
         CASE WHEN g.tid IS NOT NULL THEN g.pid WHEN g.prev_tid IS NOT NULL THEN g.prev_pid ELSE m.pid END AS pid,
         CASE WHEN g.tid IS NOT NULL THEN g.tid WHEN g.prev_tid IS NOT NULL THEN g.prev_tid ELSE m.tid END AS tid
  FROM idle_gaps g LEFT JOIN main_thread m ON m.device_id = g.device_id),"""

# Blocking calls of the launching threads, each with the cause it stands for when the device runs dry inside it.
BLOCKING = """
copies AS (  -- the copies a call's cause depends on: device-to-host, or pageable (any other copy is a plain copy)
  SELECT pid, correlation_id, any_value(direction) AS direction,
         bool_or('pageable' IN (src_kind, dst_kind)) AS pageable
  FROM memcpy WHERE direction = 'D2H' OR 'pageable' IN (src_kind, dst_kind) GROUP BY ALL),
thread_calls AS (
  SELECT a.* FROM cuda_api a JOIN threads_in t ON t.pid = a.pid AND t.tid = a.tid
  WHERE a.kind IN ('sync', 'memcpy') AND a.end_ns > $start AND a.start_ns < $end),
reach AS (  -- the (thread, bucket of $follow) in which a call returning can be the one a sync follows
  SELECT DISTINCT pid, tid, start_ns // $follow - unnest([0, 1]) AS bucket FROM thread_calls WHERE kind = 'sync'),
calls0 AS (  -- the syncs, and the copy calls that can block (below) or that a sync can follow: of 4.6 M copy calls on
  -- the 10 GB export, 40 k (numbering and joining them all took 1.8 s)
  SELECT a.pid, a.tid, a.start_ns, a.end_ns, a.name, a.kind, m.direction, coalesce(m.pageable, false) AS pageable
  FROM thread_calls a LEFT JOIN copies m ON m.pid = a.pid AND m.correlation_id = a.correlation_id
  WHERE a.kind = 'sync' OR m.pid IS NOT NULL OR a.name NOT LIKE '%Async%'
     OR (a.pid, a.tid, a.end_ns // $follow) IN (SELECT (pid, tid, bucket) FROM reach)),
bcopies AS (
  SELECT pid, tid, start_ns, end_ns, name, CASE
    WHEN direction = 'D2H' AND """ + rules.blocking_copy_sql("name", "pageable") + """ THEN 'readback'
    WHEN pageable THEN 'pageable_copy'
    WHEN name NOT LIKE '%Async%' THEN 'sync_copy' END AS cause
  FROM calls0 WHERE kind = 'memcpy'),
syncs AS (SELECT row_number() OVER () AS sync_id, pid, tid, start_ns, end_ns, name FROM calls0 WHERE kind = 'sync'),
returns AS (  -- the calls' returns in buckets of $follow: one a sync follows is in its start's bucket or the one before
  SELECT pid, tid, start_ns, end_ns, end_ns // $follow AS bucket, CASE WHEN kind = 'sync' THEN 'sync'
    WHEN direction = 'D2H' THEN 'D2H' WHEN pageable THEN 'pageable' ELSE 'copy' END AS what FROM calls0),
followed AS (  -- what the call that returned last, up to $follow before a sync began, was
  SELECT s.pid, s.tid, s.start_ns, s.end_ns, s.name, arg_max(r.what, [r.end_ns, r.start_ns]) AS what
  FROM (SELECT *, unnest([0, 1]) AS back FROM syncs) s
  LEFT JOIN returns r ON r.pid = s.pid AND r.tid = s.tid AND r.bucket = s.start_ns // $follow - s.back
    AND r.end_ns BETWEEN s.start_ns - $follow AND s.start_ns AND [r.start_ns, r.end_ns] < [s.start_ns, s.end_ns]
  GROUP BY s.sync_id, s.pid, s.tid, s.start_ns, s.end_ns, s.name),
bcalls AS (
  SELECT * FROM bcopies WHERE cause IS NOT NULL
  UNION ALL
  SELECT pid, tid, start_ns, end_ns, name, CASE WHEN what = 'D2H' THEN 'readback'
    WHEN what = 'pageable' THEN 'pageable_copy' ELSE 'sync' END FROM followed),
"""
# The blocking calls as the gap starts they stand for: the thread's latest call begun by then, while it lasts (a call
# nested in another ends the outer one's span), so a thread's spans are disjoint; written once, read by the gap
# pass (ShortGaps) and by the labelling.
CALLS_SQL = "CREATE TEMP TABLE gap_blocking_calls AS WITH " + THREADS + BLOCKING.rstrip().rstrip(",") + """
SELECT * FROM (
  SELECT pid, tid, cause, name, start_ns, end_ns, least(end_ns, coalesce(lead(start_ns) OVER (
           PARTITION BY pid, tid ORDER BY start_ns, end_ns), end_ns)) AS until_ns FROM bcalls)
WHERE until_ns > start_ns"""
SPANS = """
bspans AS (  -- cut in buckets for an equality join of the few calls with the many gaps (an ASOF join sorts every gap)
  SELECT *, unnest(range(start_ns // $bucket_ns, (until_ns - 1) // $bucket_ns + 1)) AS bucket
  FROM gap_blocking_calls),
at_start AS (  -- each gap with the call its start falls in (a queued gap's call shows only in listed gaps)
  SELECT g.*, b.cause AS blocked_cause, b.name AS blocked_in, b.end_ns AS b_end FROM gap_thread g
  LEFT JOIN bspans b ON b.pid = g.pid AND b.tid = g.tid AND b.bucket = CASE
      WHEN g.duration_ns >= $min_gap OR NOT coalesce(g.launch_end_ns <= g.start_ns, false)
      THEN g.start_ns // $bucket_ns END  -- a NULL bucket joins nothing
    AND g.start_ns >= b.start_ns AND g.start_ns < b.until_ns),"""

# What the launching threads did during the gaps that are neither queued nor short.
HOST = """
long_gaps AS MATERIALIZED (
  SELECT gap_id AS probe_id, pid, tid, start_ns, end_ns FROM gap_thread
  WHERE tid IS NOT NULL AND duration_ns > $launch_gap_max AND NOT coalesce(launch_end_ns <= start_ns, false)),
near AS MATERIALIZED (  -- the (thread, bucket) pairs in which `touch` can meet a CUDA call no longer than a bucket:
  -- the calls in none (most of them: 50 k long gaps, 29 M calls on 10 GB) are dropped before their kind is decided
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
host_events AS NOT MATERIALIZED (  -- read by both joins of `touch`: written once, 29 M events spilled on 10 GB
  SELECT a.pid, a.tid, CASE WHEN a.kind = 'module' AND regexp_matches(a.name, $jit_calls) THEN 'jit'
                           WHEN a.kind = 'module' THEN 'module' WHEN a.kind = 'alloc' THEN 'alloc'
                           WHEN a.kind IN ('launch', 'graph') AND a.end_ns - a.start_ns >= $lazy THEN 'lazy'
                           WHEN a.kind = 'sync' THEN 'sync'
                           WHEN a.kind IN ('launch', 'graph', 'memcpy', 'memset') THEN 'launch'
                           ELSE 'api' END AS what, a.start_ns, a.end_ns
  FROM cuda_api a WHERE a.end_ns > $start AND a.start_ns < $end AND (a.end_ns - a.start_ns > $bucket_ns
    OR (a.pid, a.tid, a.start_ns // $bucket_ns) IN (SELECT pid, tid, bucket FROM near))
  UNION ALL
  SELECT o.pid, o.tid, CASE WHEN regexp_matches(o.name, $waits) THEN 'wait' ELSE 'api' END, o.start_ns, o.end_ns
  FROM os_runtime o JOIN threads_in USING (pid, tid) WHERE o.end_ns > $start AND o.start_ns < $end
  UNION ALL
  SELECT n.pid, n.tid, t.what, n.start_ns, n.end_ns FROM nvtx n JOIN threads_in USING (pid, tid)
  JOIN range_kinds t ON t.text = n.text WHERE n.end_ns > $start AND n.start_ns < $end
  UNION ALL
  SELECT pid, tid, 'cpu', start_ns, end_ns FROM sched_on
  UNION ALL
  SELECT c.pid, c.tid, 'cpu', c.time_ns, c.time_ns + (SELECT ns FROM sample_period) FROM cpu_samples c
  JOIN threads_in USING (pid, tid) WHERE NOT EXISTS (SELECT 1 FROM sched LIMIT 1)
    AND c.time_ns >= $start AND c.time_ns < $end),
""" + overlaps("touch", "long_gaps", "host_events", "pid, tid", "what") + """,
host AS (
  SELECT probe_id AS gap_id, sum(end_ns - start_ns) FILTER (WHERE what = 'alloc') AS alloc_ns,
         sum(end_ns - start_ns) FILTER (WHERE what = 'jit') AS jit_ns,
         count(*) FILTER (WHERE what IN ('module', 'lazy')) AS modules,
         sum(end_ns - start_ns) FILTER (WHERE what = 'wait') AS wait_ns,
         sum(end_ns - start_ns) FILTER (WHERE what = 'comm') AS comm_ns,
         sum(end_ns - start_ns) FILTER (WHERE what = 'sync') AS sync_ns,
         sum(end_ns - start_ns) FILTER (WHERE what = 'launch') AS launch_ns,
         sum(end_ns - start_ns) FILTER (WHERE what = 'cpu') AS cpu_ns,
         sum(end_ns - start_ns) FILTER (WHERE what IN ('alloc', 'jit', 'module', 'lazy', 'launch', 'sync', 'api'))
           AS api_ns
  FROM touch GROUP BY probe_id),"""

HOST_SQL = "CREATE TEMP TABLE gap_host AS WITH " + WORK + HOST.rstrip().rstrip(",") + """
SELECT * FROM host"""

LABELLED = "WITH " + WORK + SPANS + """
judged AS (
  SELECT g.*, CASE
    WHEN g.launch_end_ns <= g.start_ns THEN 'queued'
    WHEN g.duration_ns <= $launch_gap_max AND g.blocked_cause IS NOT NULL THEN g.blocked_cause
    WHEN g.duration_ns <= $launch_gap_max AND g.launch_end_ns IS NULL THEN 'host_untraced'
    WHEN g.duration_ns <= $launch_gap_max THEN
      CASE WHEN g.tiny THEN 'launch_tiny' ELSE 'launch' END
    WHEN h.jit_ns > 0 OR h.modules > 0 THEN 'jit'
    WHEN h.alloc_ns >= $dominant * g.duration_ns THEN 'alloc'
    WHEN h.comm_ns >= $dominant * g.duration_ns THEN 'host_comm'
    WHEN h.wait_ns >= $dominant * g.duration_ns THEN 'host_wait'
    WHEN g.blocked_cause IS NOT NULL THEN g.blocked_cause END AS early_cause, CASE
    WHEN h.sync_ns >= $dominant * g.duration_ns THEN 'sync'
    WHEN h.launch_ns >= $dominant * g.duration_ns THEN 'launch'
    WHEN h.cpu_ns - coalesce(h.api_ns, 0) >= $dominant * g.duration_ns THEN 'host_cpu'
    WHEN g.duration_ns <= $overhead_max AND g.launch_end_ns IS NOT NULL THEN
      CASE WHEN g.tiny THEN 'launch_tiny' ELSE 'launch' END
    ELSE 'host_untraced' END AS host_cause
  FROM at_start g LEFT JOIN gap_host h USING (gap_id)),
split AS (
  SELECT *, coalesce(early_cause, host_cause) AS cause,
         CASE WHEN early_cause = blocked_cause AND host_cause <> early_cause
              THEN greatest(0, end_ns - (b_end + $resume_max)) ELSE 0 END AS late_ns
  FROM judged),
labelled AS (
  SELECT gap_id, device_id, start_ns, end_ns, duration_ns, pid, tid, blocked_in, cause, late_ns,
         CASE WHEN late_ns > 0 THEN host_cause END AS late_cause FROM split)"""



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


TOTALS_SQL = LABELLED + """,
kept AS MATERIALIZED (  -- a row of its own for each gap that can be listed, resume late or be a pause; the shorter
  -- ones (most of them) summed into one row per device, cause and blocking call (gap_id NULL, gaps > 1), as their
  -- count and time are all the totals need
  SELECT gap_id, device_id, cause, blocked_in, count(*) AS gaps, sum(duration_ns) AS ns,
         CASE WHEN gap_id IS NOT NULL THEN any_value(start_ns) END AS start_ns,
         CASE WHEN gap_id IS NOT NULL THEN any_value(end_ns) END AS end_ns,
         CASE WHEN gap_id IS NOT NULL THEN any_value(duration_ns) END AS duration_ns,
         any_value(pid) AS pid, any_value(tid) AS tid, coalesce(any_value(late_ns), 0) AS late_ns,
         any_value(late_cause) AS late_cause
  FROM (SELECT * REPLACE (CASE WHEN duration_ns < least($bubble_min, $gc_min) AND duration_ns <= $resume_max
                               THEN NULL ELSE gap_id END AS gap_id) FROM labelled)
  GROUP BY gap_id, device_id, cause, blocked_in
  UNION ALL  -- the short gaps the pass only counted: queued (gap_pass.Folded) or judged in passing (ShortGaps)
  SELECT NULL, unnest($folded_devices), unnest($folded_causes), unnest($folded_calls), unnest($folded_gaps),
         unnest($folded_ns), NULL, NULL, NULL, NULL, NULL, 0, NULL),
pieces0 AS (  -- a gap's time by cause: all of it, or its blocking call's share and the late resume after it
  SELECT gap_id, device_id, cause, gaps, start_ns, ns - late_ns AS ns, duration_ns FROM kept
  UNION ALL SELECT gap_id, device_id, late_cause, 1, end_ns - late_ns, late_ns, duration_ns FROM kept
  WHERE late_ns > 0),
pieces AS (  -- host_id: the gap's id on its piece with no host activity traced (a gap has one at most)
  SELECT *, CASE WHEN cause IN ('host_untraced', 'host_cpu') THEN gap_id END AS host_id FROM pieces0),
host_gaps AS (  -- stretches of 1 to 100 ms in which the host did nothing traced, a late resume's included
  SELECT host_id AS gap_id, device_id, start_ns, ns AS duration_ns FROM pieces
  WHERE host_id IS NOT NULL AND ns BETWEEN $gc_min AND $gc_max),
""" + periodic("pauses", "host_gaps", "device_id") + """,
apis AS (
  SELECT device_id, cause, first(blocked_in ORDER BY ns DESC, blocked_in) AS api FROM (
    SELECT device_id, cause, blocked_in, sum(ns) AS ns FROM kept
    WHERE cause IN ('sync', 'readback', 'pageable_copy', 'sync_copy') AND blocked_in IS NOT NULL GROUP BY ALL)
  GROUP BY ALL),
totals AS (
  SELECT l.device_id, l.cause, sum(l.gaps)::BIGINT AS gaps, sum(l.ns)::BIGINT AS ns,
         coalesce(sum(l.ns) FILTER (WHERE l.duration_ns >= $bubble_min), 0)::BIGINT AS long_ns,
         coalesce(sum(l.ns) FILTER (WHERE p.periodic), 0)::BIGINT AS periodic_ns,
         count(*) FILTER (WHERE p.periodic) AS periodic_gaps,
         median(p.period_ns) FILTER (WHERE p.periodic)::BIGINT AS period_ns, any_value(a.api) AS api
  FROM pieces l LEFT JOIN pauses p ON p.gap_id = l.host_id
  LEFT JOIN apis a ON a.device_id = l.device_id AND a.cause = l.cause
  GROUP BY l.device_id, l.cause)
SELECT (SELECT list(t ORDER BY t.device_id, t.ns DESC, t.cause) FROM totals t),
       (SELECT list({gap_id: gap_id, device: device_id, start_ns: start_ns, end_ns: end_ns, cause: cause,
                     blocked_in: blocked_in, pid: pid, tid: tid, late_ns: late_ns, late_cause: late_cause}
                    ORDER BY gap_id)
        FROM kept WHERE duration_ns >= $min_gap)
"""


MAIN_THREAD_SQL = "WITH " + THREADS.rstrip().rstrip(",") + """
SELECT device_id, pid, tid FROM main_thread WHERE pid IS NOT NULL AND tid IS NOT NULL"""
SPANS_SQL = """SELECT pid, tid, cause, name, start_ns, until_ns FROM gap_blocking_calls
WHERE pid IS NOT NULL AND tid IS NOT NULL ORDER BY pid, tid, start_ns"""
