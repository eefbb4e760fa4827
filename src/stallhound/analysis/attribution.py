"""Why is each device idle? Every idle nanosecond of a device in the window, attributed to one cause.

A device's idle time is the window minus the union of its kernels, copies, memsets and whole CUDA graph
executions (as intervals.GPU_WORK),
cut into gaps (the stretches before its first and after its last operation in the window included). Each
gap gets one cause, or two for a late resume after a blocking call (below), so causes never share
nanoseconds and their sum is the device's idle time:

- queued: the operation after the gap had been launched before the gap began (its launch call returned
  first): the device waited on something other than the host (an event, another stream or device).
- sync / readback / pageable_copy / sync_copy: the host was inside a blocking call when the device ran dry,
  so nothing more was queued: a synchronize call; a device-to-host copy, or a synchronize right after one
  (the .item() pattern); a copy from pageable host memory, or a synchronize right after one; another
  synchronous copy. The call is why the device ran dry however late the host resumes: it keeps the gap up
  to SYNC_RESUME_MAX_NS after it returned (the host's turnaround, which work queued ahead would have
  hidden); what lies past that is the late resume (late_ns), judged by what the host did in the gap like a
  gap without a blocking call (sync, launch, host_cpu, host_untraced). A synchronize call covering most of
  a longer gap also counts as sync (the host waited on other work meanwhile).
- launch_tiny / launch: a short gap (<= LAUNCH_GAP_MAX_NS) before a work item the host launched only after
  the device had gone idle: the cost of launching, between tiny kernels or not. A gap of up to
  OP_OVERHEAD_MAX_NS before such a late launch, with no other host activity seen, counts too: the host was
  busy issuing work (a framework's per-operation overhead), not waiting.
- jit: a module load or a run-time compile (module-loading calls, compile NVTX ranges) inside the gap.
- alloc: device-memory allocation or free calls cover most of the gap.
- host_comm: the launching threads were inside communication NVTX ranges (MPI_*, SHMEM) for most of the gap.
- host_wait: the launching threads sat in OS-runtime waits (poll, read, futex, ...) or inside data-loading
  NVTX ranges (data, fetch, collate, ...) for most of the gap.
- host_cpu: scheduler data or CPU samples show the launching threads on a CPU, outside CUDA calls, for
  most of the gap.
- host_untraced: none of the above can be seen (no CUDA call, no host data).

A gap is judged by one host thread: the one that launched the operation after it (else the one before it,
else the thread that launched most work on the device, when those launches were not traced), since its
lateness is what kept the device idle. Longer gaps are judged by
what that thread did during the gap: a heavy activity (jit, alloc, waits) covering most of it outranks the
blocking call that began it, because removing the call alone would not remove the gap. Times are integer
ns clipped to the window.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import duckdb
import numpy as np

from stallhound.analysis import gap_pass, nvtx_texts, rules
from stallhound.analysis.common import Scope, per_model
from stallhound.analysis.device_pass import DEFAULT_SLICES
from stallhound.analysis.intervals import overlaps

Cause = Literal["queued", "sync", "readback", "pageable_copy", "sync_copy", "launch_tiny", "launch", "jit", "alloc",
                "host_comm", "host_wait", "host_cpu", "host_untraced"]

LAUNCH_GAP_MAX_NS = 50_000  # 50 us: eager frameworks spend up to this much host time per op; longer is other work
DOMINANT_SHARE = 0.5  # a host activity covering half a gap explains it
BUBBLE_MIN_NS = 1_000_000  # 1 ms: shorter idle stretches are launch jitter, not bubbles (book gpu-bubbles)
PAUSE_MAX_NS = 100_000_000  # a collection pass takes ms to tens of ms; longer periodic gaps are other waits
SIMILAR_RATIO = 1.2  # gap lengths (and periods) within 20% of each other count as the same pattern
PERIODIC_MIN_GAPS = 3  # a pattern needs three gaps (two intervals) to show a period
STEADY_SHARE = 0.75  # share of start-to-start intervals within 20% of the median for a periodic group
OP_OVERHEAD_MAX_NS = 500_000  # 0.5 ms: an eager framework's host work for one op (Python, dispatch, launch)
SYNC_RESUME_MAX_NS = 1_000_000  # 1 ms: a step's host turnaround after a wait; past it the host is late
LAZY_LOAD_MIN_NS = 500_000  # 0.5 ms: a launch call this long on an idle device is loading its module (lazy loading)
FOLD_BELOW_NS = min(BUBBLE_MIN_NS, SYNC_RESUME_MAX_NS + 1)  # queued gaps this short are neither listed nor pauses:
# the pass only counts them (TOTALS_SQL's kept sums them into one row per device)
HOST_PROBE_BUCKET_NS = 1_000_000  # equality-join buckets: long gaps x host events, gap starts x blocking calls
DEVICE_PASS_SLICES = DEFAULT_SLICES  # the device pass the gap pass fills
# in passing (same chunks): the one shares reads on every window attributed, and gpu_utilization by default
JIT_MODULE_CALLS = "^(cuModuleLoadData|cuModuleLoadDataEx|cuModuleLoadFatBinary|cuLibraryLoadData|cuLinkComplete)"

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


def range_kinds(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(text, kind) of the NVTX range texts that count as jit, comm or wait (a text may be two kinds), each distinct
    text matched once (the regexes cost more than the scan): window-independent, so once per model."""
    return nvtx_texts.classified(con).range_kinds


def args(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[str, object]:
    """Bound parameters of LABELLED for a scope (callers add their own)."""
    kinds = range_kinds(con)
    return {"start": scope.start_ns, "end": scope.end_ns, "devices": scope.devices,
            "follow": rules.READBACK_FOLLOW_NS, "launch_gap_max": LAUNCH_GAP_MAX_NS, "dominant": DOMINANT_SHARE,
            "waits": rules.WAIT_CALLS, "range_texts": [t for t, _ in kinds], "range_kinds": [k for _, k in kinds],
            "jit_calls": JIT_MODULE_CALLS, "bucket_ns": HOST_PROBE_BUCKET_NS, "lazy": LAZY_LOAD_MIN_NS,
            "resume_max": SYNC_RESUME_MAX_NS, "overhead_max": OP_OVERHEAD_MAX_NS}


PERIODIC_ARGS = {"similar": SIMILAR_RATIO, "min_gaps": PERIODIC_MIN_GAPS, "steady_share": STEADY_SHARE}
STAGED = ("gap_work_threads", "gap_blocking_calls", "gap_host")  # temp tables LABELLED reads beside idle_gaps


def bound(sql: str, params: dict[str, object]) -> dict[str, object]:
    """The entries of `params` that `sql` names ($name): DuckDB refuses parameters a statement does not use."""
    return {name: params[name] for name in set(re.findall(r"\$(\w+)", sql)) if name in params}


UNBLOCKED = ("host_untraced", "launch_tiny", "launch")  # a short gap's cause with no blocking call, coded -1, -2, -3


class ShortGaps:
    """The gap pass's judge (gap_pass.Judge) of the gaps LABELLED would only count: not queued, at most
    LAUNCH_GAP_MAX_NS and shorter than the pass's fold limit. Each gets the cause LABELLED gives it (the blocking
    call whose span (CALLS_SQL) holds its start on its thread, else host_untraced when the work after it was not
    launched by a traced call, else launch_tiny or launch) and is counted and summed per (device, cause, call)
    instead of written: on the 10 GB export most of its 11 M gaps, which the labelling then no longer reads."""

    def __init__(self, spans: dict[str, np.ndarray], main_threads: dict[int, tuple[int, int]], below_ns: int):
        self.below_ns, self.main_threads = below_ns, main_threads
        self.labels = sorted(set(spans["cause"].tolist()) | set(spans["name"].tolist()) - {None})
        ids = {label: i for i, label in enumerate(self.labels)}  # a call with no name: -1, as no call (NULL)
        self.spans: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
        cause = np.array([ids[c] for c in spans["cause"].tolist()], dtype=np.int64)
        name = np.array([ids.get(n, -1) for n in spans["name"].tolist()], dtype=np.int64)
        thread = np.stack([spans["pid"], spans["tid"]], axis=1).astype(np.int64)
        edges = np.flatnonzero(np.any(thread[1:] != thread[:-1], axis=1)) + 1  # SPANS_SQL sorts by thread, start
        for lo, hi in zip(np.concatenate(([0], edges)), np.concatenate((edges, [len(thread)])), strict=True):
            if hi > lo:
                self.spans[int(thread[lo, 0]), int(thread[lo, 1])] = (
                    spans["start_ns"][lo:hi], spans["until_ns"][lo:hi], cause[lo:hi], name[lo:hi])
        self.counted: dict[tuple[int, str, str | None], list[int]] = {}

    def __call__(self, device: int, gaps: dict[str, np.ndarray]) -> np.ndarray:
        start, end, launch_end = gaps["start_ns"], gaps["end_ns"], gaps["launch_end_ns"]
        duration = end - start
        judged = (duration < self.below_ns) & (duration <= LAUNCH_GAP_MAX_NS) & ~(launch_end <= start)
        if not judged.any():
            return judged
        at = np.flatnonzero(judged)
        pid, tid = self._threads(device, {k: gaps[k][at] for k in ("pid", "tid", "prev_pid", "prev_tid")})
        cause = np.where(launch_end[at] == gap_pass.NO_TIME, -1, np.where(gaps["tiny"][at], -2, -3))  # UNBLOCKED
        call = np.full(len(at), -1)
        begins = start[at]
        for key, (starts, untils, causes, names) in self.spans.items():
            mine = np.flatnonzero((pid == key[0]) & (tid == key[1]))
            if not len(mine):
                continue
            span = np.searchsorted(starts, begins[mine], side="right") - 1
            inside = (span >= 0) & (begins[mine] < untils[np.maximum(span, 0)])
            cause[mine[inside]], call[mine[inside]] = causes[span[inside]], names[span[inside]]
        for c, n in set(zip(cause.tolist(), call.tolist(), strict=True)):
            these = (cause == c) & (call == n)
            label = UNBLOCKED[-c - 1] if c < 0 else self.labels[c]
            sums = self.counted.setdefault((device, label, self.labels[n] if n >= 0 else None), [0, 0])
            sums[0] += int(these.sum())
            sums[1] += int(duration[at][these].sum())
        return judged

    def _threads(self, device: int, g: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Each gap's thread as gap_thread picks it: the next work's, else the previous work's, else the device's
        main thread (NO_THREAD when it has none)."""
        main = self.main_threads.get(device, (gap_pass.NO_THREAD, gap_pass.NO_THREAD))
        own, prev = g["tid"] != gap_pass.NO_THREAD, g["prev_tid"] != gap_pass.NO_THREAD
        pid = np.where(own, g["pid"], np.where(prev, g["prev_pid"], main[0]))
        tid = np.where(own, g["tid"], np.where(prev, g["prev_tid"], main[1]))
        return pid, tid


MAIN_THREAD_SQL = "WITH " + THREADS.rstrip().rstrip(",") + """
SELECT device_id, pid, tid FROM main_thread WHERE pid IS NOT NULL AND tid IS NOT NULL"""
SPANS_SQL = """SELECT pid, tid, cause, name, start_ns, until_ns FROM gap_blocking_calls
WHERE pid IS NOT NULL AND tid IS NOT NULL ORDER BY pid, tid, start_ns"""


@contextmanager
def labelled_inputs(con: duckdb.DuckDBPyConnection, scope: Scope, fold_below_ns: int,
                    slices: int | None = None) -> Iterator[tuple[gap_pass.Folded, ShortGaps]]:
    """What LABELLED reads, as temp tables while the block runs: idle_gaps (gap_pass.idle_gaps, with its arguments;
    the short gaps judged in the pass by ShortGaps, returned with the pass's Folded) and STAGED, each written by its
    own statement. Inside one labelling query DuckDB took the blocking calls' spans and the long gaps' host activity
    for larger than the gaps, and hashed the 11 M gaps of the 10 GB export twice (6.2-10 s); written first, their
    sizes are known, and with the short gaps judged in the pass the three statements take 0.5 + 0.5 + 0.3 s."""
    params = args(con, scope)
    try:
        for sql in (THREADS_SQL, CALLS_SQL):
            con.execute(sql, bound(sql, params))
        spans = con.execute(SPANS_SQL).fetchnumpy()
        main_threads = {d: (p, t) for d, p, t in con.execute(MAIN_THREAD_SQL).fetchall()}
        short = ShortGaps(spans, main_threads, fold_below_ns)
        with gap_pass.idle_gaps(con, scope, rules.TINY_KERNEL_NS, fold_below_ns, slices, short) as folded:
            con.execute(HOST_SQL, bound(HOST_SQL, params))
            yield folded, short
    finally:
        for table in STAGED:
            con.execute(f"DROP TABLE IF EXISTS {table}")


@dataclass(frozen=True)
class CauseTime:
    ns: int
    gaps: int
    long_ns: int = 0  # in gaps of at least BUBBLE_MIN_NS
    periodic_ns: int = 0  # in periodic host stretches (gaps or late resumes) of BUBBLE_MIN_NS..PAUSE_MAX_NS
    #                       (host_untraced/host_cpu only)
    periodic_gaps: int = 0
    period_ns: int | None = None
    api: str | None = None  # for the blocking causes: the API whose gaps hold the most of their idle time


@dataclass(frozen=True)
class DeviceIdle:
    device: int
    window_ns: int
    idle_ns: int
    causes: dict[str, CauseTime] = field(default_factory=dict)

    def ns(self, *causes: str) -> int:
        return sum(self.causes[c].ns for c in causes if c in self.causes)

    @property
    def busy_pct(self) -> float:
        return round(100.0 * (self.window_ns - self.idle_ns) / self.window_ns, 2) if self.window_ns else 0.0


@dataclass(frozen=True)
class Gap:
    """A gap of at least BUBBLE_MIN_NS, with its cause and the host thread it was judged by."""
    gap_id: int
    device: int
    start_ns: int
    end_ns: int
    cause: str
    blocked_in: str | None
    pid: int | None
    tid: int | None
    late_ns: int = 0  # a gap begun inside a blocking call: the host's late resume past its share (cause: late_cause)
    late_cause: str | None = None


@dataclass(frozen=True)
class Attribution:
    devices: dict[int, DeviceIdle]
    long_gaps: list[Gap]  # every gap of at least BUBBLE_MIN_NS, in device and time order


def attribute(con: duckdb.DuckDBPyConnection, scope: Scope) -> Attribution:
    """Idle time per device and cause over the scope, and its long gaps (computed once per model and scope)."""
    key = ("attribution", tuple(scope.devices), scope.start_ns, scope.end_ns)
    return per_model(con, key, lambda: _attribute(con, scope))


def _attribute(con: duckdb.DuckDBPyConnection, scope: Scope) -> Attribution:
    params = {**args(con, scope), **PERIODIC_ARGS, "bubble_min": BUBBLE_MIN_NS, "min_gap": BUBBLE_MIN_NS,
              "gc_min": BUBBLE_MIN_NS, "gc_max": PAUSE_MAX_NS}
    with labelled_inputs(con, scope, FOLD_BELOW_NS, DEVICE_PASS_SLICES) as (folded, short):
        counted = [(d, "queued", None, n, folded.ns[d]) for d, n in folded.gaps.items() if n]
        counted += [(d, cause, call, n, ns) for (d, cause, call), (n, ns) in short.counted.items()]
        params.update({f"folded_{name}": [row[i] for row in counted]
                       for i, name in enumerate(("devices", "causes", "calls", "gaps", "ns"))})
        totals, long_gaps = con.execute(TOTALS_SQL, bound(TOTALS_SQL, params)).fetchone()
    found: dict[int, dict[str, CauseTime]] = {d: {} for d in scope.devices}
    for t in totals or []:
        found[t["device_id"]][t["cause"]] = CauseTime(
            ns=int(t["ns"]), gaps=t["gaps"], long_ns=int(t["long_ns"]), periodic_ns=int(t["periodic_ns"]),
            periodic_gaps=t["periodic_gaps"], period_ns=t["period_ns"], api=t["api"])
    devices = {d: DeviceIdle(device=d, window_ns=scope.duration_ns, idle_ns=sum(c.ns for c in causes.values()),
                             causes=causes) for d, causes in found.items()}
    return Attribution(devices=devices, long_gaps=[Gap(**g) for g in long_gaps or []])
