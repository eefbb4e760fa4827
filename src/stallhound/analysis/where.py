"""Where in the program a finding's events were made: the top call sites (analysis.stacks) of the host events its root
cause is about, on its device in the window, with how many of them had a call stack.

The events of each root cause (SETS), those starting in the window, on the finding's device; "its threads" are the
threads that launched the device's work in the window, as the idle attribution judges gaps by them:
- excessive-synchronization, blocking-d2h-sync: its threads' blocking calls that the idle attribution gives that
  cause (attribution_sql.BLOCKING: synchronize calls and synchronous copies; small device-to-host reads and the
  synchronize right after one); share of the host's time blocked in them;
- alloc-in-loop, module-loading-hot-path, torch-compile-recompilation: its threads' allocation or free calls, module
  loads; share of their host time;
- small-kernel-overhead: the launch calls of the device's kernels; share of their host time;
- pageable-host-memory, excessive-h2d-transfers: the device's copies from pageable memory (those that pay for their
  staging: rules.staged_sql), host-to-device (many-small:
  of SMALL_UPLOAD_BYTES or less), each placed by its copy call; share of the calls' host time;
- dataloader-starvation: its threads' OS-runtime waits (rules.WAIT_CALLS); share of their time;
- cpu-bottleneck (CPU work in the gaps): its threads' CPU samples taken while the device idled between two pieces of
  its work, share of the samples; in a profile without CPU samples (torch.profiler), the device's launch calls;
  none where its idle was Python code (host-python: its title names the frame, python_work).
Other findings (a kernel's, communication, the device's own, the profiler's) have no `where`. A profile without any
stack says so once (note), never per finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import duckdb

from stallhound.analysis import rules, stacks
from stallhound.analysis.attribution_sql import BLOCKING, THREADS, THREADS_SQL
from stallhound.analysis.common import CallSite, Finding, Scope, Where, pct
from stallhound.analysis.intervals import BUSY, gaps
from stallhound.analysis.small_uploads import SMALL_UPLOAD_BYTES
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row

MAX_SITES = 3  # sites a finding carries: the fix is at the first one or two
TEXT_SITES = 2  # ... and its one line names
SIGNATURE_MAX = 60  # characters of a function's name the line shows whole; a longer C++ signature loses its parameters
TEXT_MIN_SHARE_PCT = 10.0  # a second site under a tenth of the time is not worth the line's room

# The device's launching threads, as the idle attribution finds them (gap_work_threads, main_thread, threads_in).
THREADS_IN = ("gap_work_threads AS (" + THREADS_SQL.removeprefix("CREATE TEMP TABLE gap_work_threads AS") + "),\n"
              + THREADS)
BLOCKED = THREADS_IN + BLOCKING + """chosen AS (
  SELECT max(a.stack_id) AS stack_id, any_value(b.end_ns - b.start_ns) AS time_ns FROM bcalls b
  LEFT JOIN cuda_api a ON a.pid = b.pid AND a.tid = b.tid AND a.start_ns = b.start_ns AND a.name = b.name
  WHERE list_contains($causes, b.cause) AND b.start_ns >= $start AND b.start_ns < $end
  GROUP BY b.pid, b.tid, b.start_ns, b.name)"""
API_KIND = THREADS_IN + """chosen AS (  -- one row per call: an older export records some twice under one correlation id
  SELECT max(a.stack_id) AS stack_id, max(a.duration_ns) AS time_ns FROM cuda_api a JOIN threads_in USING (pid, tid)
  WHERE a.kind = $kind AND a.start_ns >= $start AND a.start_ns < $end
  GROUP BY a.pid, a.correlation_id, CASE WHEN a.correlation_id IS NULL THEN a.start_ns END)"""
LAUNCH_CALLS = """chosen AS (
  SELECT max(a.stack_id) AS stack_id, max(a.duration_ns) AS time_ns FROM cuda_api a
  WHERE a.kind IN ('launch', 'graph') AND a.start_ns >= $start AND a.start_ns < $end
    AND (a.pid, a.correlation_id) IN (
      SELECT pid, correlation_id FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start
      UNION ALL SELECT pid, correlation_id FROM graph_exec
      WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start)
  GROUP BY a.pid, a.correlation_id)"""
COPIES = """chosen AS (
  SELECT any_value(a.stack_id) AS stack_id,
         any_value(coalesce(m.launch_end_ns - m.launch_start_ns, m.duration_ns)) AS time_ns
  FROM memcpy m LEFT JOIN (SELECT pid, correlation_id, max(stack_id) AS stack_id FROM cuda_api
                           WHERE kind = 'memcpy' GROUP BY ALL) a USING (pid, correlation_id)
  WHERE m.device_id IN (SELECT unnest($devices)) AND m.start_ns >= $start AND m.start_ns < $end
    AND ($direction IS NULL OR m.direction = $direction) AND (NOT $pageable OR 'pageable' IN (m.src_kind, m.dst_kind))
    AND ($max_bytes IS NULL OR m.bytes <= $max_bytes) AND (NOT $staged OR """ + rules.staged_sql("m.bytes") + """)
  GROUP BY m.pid, m.correlation_id, CASE WHEN m.correlation_id IS NULL THEN m.start_ns END)"""
OS_WAITS = THREADS_IN + """chosen AS (
  SELECT o.stack_id, o.duration_ns AS time_ns FROM os_runtime o JOIN threads_in USING (pid, tid)
  WHERE regexp_matches(o.name, $waits) AND o.start_ns >= $start AND o.start_ns < $end)"""
IDLE_SAMPLES = THREADS_IN + BUSY + ",\n" + gaps("idle", "busy", "device_id") + """,
chosen AS (
  SELECT s.stack_id, NULL::BIGINT AS time_ns FROM cpu_samples s JOIN threads_in USING (pid, tid)
  ASOF JOIN idle g ON s.time_ns >= g.start_ns
  WHERE s.time_ns < g.end_ns AND s.time_ns >= $start AND s.time_ns < $end)"""


@dataclass(frozen=True)
class EventSet:
    """A finding's events: CTEs ending in `chosen(stack_id, time_ns)`, one row per event, over $start, $end,
    $devices and `args`; `what` names them, `basis` what a share is of (counted: their number, as samples have no
    time)."""
    sql: str
    what: str
    basis: str
    args: dict[str, object] = field(default_factory=dict)
    counted: bool = False


BLOCKED_BASIS = "blocked time"
COPY_ARGS = {"direction": None, "pageable": False, "max_bytes": None, "staged": False}
LAUNCHES = EventSet(LAUNCH_CALLS, "launch calls of the device's kernels", "host time")
SAMPLES = EventSet(IDLE_SAMPLES, "CPU samples of the launching threads while the device idled", "samples",
                   counted=True)
SETS = {
    "excessive-synchronization": EventSet(BLOCKED, "synchronize calls and synchronous copies", BLOCKED_BASIS,
                                          {"causes": ["sync", "sync_copy"]}),
    "blocking-d2h-sync": EventSet(BLOCKED, "blocking small device-to-host reads (the copy, or the synchronize right "
                                           "after it)", BLOCKED_BASIS, {"causes": ["readback"]}),
    "alloc-in-loop": EventSet(API_KIND, "allocation and free calls", "host time", {"kind": "alloc"}),
    "module-loading-hot-path": EventSet(API_KIND, "module loads", "host time", {"kind": "module"}),
    "torch-compile-recompilation": EventSet(API_KIND, "module loads", "host time", {"kind": "module"}),
    "small-kernel-overhead": LAUNCHES,
    "pageable-host-memory": EventSet(COPIES, f"copies of {rules.PAGEABLE_STAGED_BYTES >> 10} KiB or more from "
                                     "pageable memory", "copy calls' host time",
                                     {**COPY_ARGS, "pageable": True, "staged": True}),
    "excessive-h2d-transfers": EventSet(COPIES, "host-to-device copies", "copy calls' host time",
                                        {**COPY_ARGS, "direction": "H2D"}),
    "dataloader-starvation": EventSet(OS_WAITS, "OS waits of the launching threads", "wait time",
                                      {"waits": rules.WAIT_CALLS}),
    "cpu-bottleneck": SAMPLES,
}
SMALL_UPLOADS = EventSet(COPIES, f"host-to-device copies of {SMALL_UPLOAD_BYTES >> 10} KiB or less",
                         "copy calls' host time", {**COPY_ARGS, "direction": "H2D", "max_bytes": SMALL_UPLOAD_BYTES})


def has_stacks(con: duckdb.DuckDBPyConnection) -> bool:
    return one_row(con.execute("SELECT EXISTS (SELECT 1 FROM stacks)"))[0]


def about_host(finding: Finding) -> bool:
    """Is the finding about host events (it has an event set)?"""
    return finding.root_cause in SETS


def event_set(con: duckdb.DuckDBPyConnection, finding: Finding) -> EventSet | None:
    """The finding's events (SETS), None when it is not about host events."""
    if finding.root_cause == "excessive-h2d-transfers" and "many-small" in finding.tags:
        return SMALL_UPLOADS
    if finding.root_cause == "cpu-bottleneck" and "host-python" in finding.tags:
        return None  # its title names the Python frame the idle was spent in; launch calls are not about it
    if finding.root_cause == "cpu-bottleneck":
        return SAMPLES if one_row(con.execute("SELECT EXISTS (SELECT 1 FROM cpu_samples)"))[0] else LAUNCHES
    return SETS.get(finding.root_cause)


def locate(con: duckdb.DuckDBPyConnection, scope: Scope, finding: Finding) -> Where | None:
    """The finding's top call sites in the window, None when it is not about host events, has no device, or none of
    its events lies in the window. Call only on a profile with stacks (has_stacks)."""
    chosen = event_set(con, finding)
    if chosen is None or finding.device is None:
        return None
    bound = {"start": scope.start_ns, "end": scope.end_ns, "devices": [finding.device], **chosen.args,
             "follow": rules.READBACK_FOLLOW_NS, "small_read": rules.SMALL_READ_BYTES}
    used = {k: v for k, v in bound.items() if f"${k}" in chosen.sql}
    matched, with_stack, stacked_ns = one_row(con.execute(f"WITH {chosen.sql}\n{stacks.COVERAGE}", used))
    if not matched:
        return None
    found = stacks.sites(con, f"{chosen.sql},\n{stacks.EVENTS}", used, MAX_SITES, by_callee=False)[:MAX_SITES]
    whole = with_stack if chosen.counted else stacked_ns or 0
    sites = [CallSite(function=frame.function, module=frame.module, line=frame.line, calls=callee,
                      user_frame=frame.layer is None, events=n, share_pct=pct(n if chosen.counted else time_ns or 0,
                                                                              whole))
             for frame, callee, n, time_ns, _ in found]
    return Where(events=chosen.what, basis=chosen.basis, matched=matched, with_stack=with_stack,
                 coverage_pct=pct(with_stack, matched), sites=sites,
                 text=_text(chosen, matched, with_stack, [_place(f) for f, *_ in found], sites))


def _place(frame: stacks.Frame) -> str:
    return stacks.where(replace(frame, function=_short(frame.function)) if frame.function else frame)


def _short(name: str) -> str:
    """A long C++ signature with its parameter list cut to (...): the line names the function, the site keeps it
    whole."""
    if len(name) <= SIGNATURE_MAX:
        return name
    depth = 0
    for i, char in enumerate(name):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "(" and depth == 0 and i > 0 and not name[:i].endswith("operator"):
            return name[:i] + "(...)"
    return name


def _text(chosen: EventSet, matched: int, with_stack: int, places: list[str], sites: list[CallSite]) -> str:
    """The top sites in one line, with the coverage: 'its 6 small device-to-host reads ..., all with a call stack:
    83% of the blocked time: `step` in train.py:29 (calls item)'."""
    if not sites:
        return f"its {matched:,} {chosen.what}: none has a call stack"
    full = with_stack == matched
    head = f"its {matched:,} {chosen.what}, {'all' if full else f'{with_stack:,}'} with a call stack"
    basis = f" of the {chosen.basis}{'' if full else f' of those {with_stack:,}'}"
    shown = [f"{s.share_pct:.0f}%{'' if i else basis}: {place}"
             + (f" (calls {_short(s.calls)})" if s.calls else "")
             + ("" if s.user_frame else " (no frame of the program)")
             for i, (s, place) in enumerate(zip(sites, places, strict=True))
             if i == 0 or (i < TEXT_SITES and s.share_pct >= TEXT_MIN_SHARE_PCT)]
    return f"{head}: {'; '.join(shown)}"


def note(con: duckdb.DuckDBPyConnection, findings: Sequence[Finding]) -> str | None:
    """Once per triage: why findings about host events name no call site, with the capture that records them;
    None when every such finding's events have stacks, or there is none."""
    host = [f for f in findings if about_host(f)]
    if not host:
        return None
    capture = remedy(con, ("stacks",))
    if not has_stacks(con):
        return (f"this profile has no call stacks, so {_findings(len(host))} about host events cannot say where in "
                f"the program {'it arises' if len(host) == 1 else 'they arise'}; capture with {capture}")
    blind = [f for f in host if f.where is not None and f.where.with_stack == 0]
    if not blind:
        return None
    return (f"{_findings(len(blind))} about host events {'has' if len(blind) == 1 else 'have'} no call stack on "
            f"{'its' if len(blind) == 1 else 'their'} events (the profile records stacks of other events only); "
            f"capture with {capture}")


def _findings(n: int) -> str:
    return "1 finding" if n == 1 else f"{n:,} findings"
