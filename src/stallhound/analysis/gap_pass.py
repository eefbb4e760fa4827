"""Each device's idle gaps in a scope, from one start-ordered numpy pass over its work in time chunks, written to the
temp table `idle_gaps` that the idle attribution's SQL reads.

A gap runs from the latest end so far (operations in (start, end) order, the window's start counting as one) to
the next start when that is later; the window's end closes the last one. Per gap: gap_id (the device x
GAP_ID_STRIDE + the row of the operation before it in that order, the window's start being row 1, so ids sort by
device and time), device_id, start_ns, end_ns, duration_ns, launch_end_ns (when the launch call of the operation
after it returned; of operations starting together, the first returned; NULL when none was traced), tiny (an
operation just before or just after it is a tiny kernel), pid/tid of the thread that launched the operation after
it (of operations starting together, the one whose launch returned first; NULL: not traced), and prev_pid/prev_tid
of the thread that launched an operation ending where the gap begins (of several, the last in that order; NULL:
none traced), and driver (the operation after it is a unified-memory migration the driver issued,
rules.DRIVER_MIGRATION_SQL, and none starting with it was launched by a traced call), and touched (the operations
ending where it begins and starting where it ends are migrations a host thread's touch caused, rules.HOST_TOUCH_SQL,
none launched by a traced call: the host was reading managed memory page by page across it), and busy_from_ns (where
the device's run of work before the gap began: the end of the last gap before it that was not queued, or the window's
start; the queued gaps inside the run are stalls between work it already had), and the longer run that only a gap
the host had not yet begun to launch the work after ends (its launch call began only after the gap began), a gap
whose launch or copy call was under way (a synchronous copy's own latency inside the call) not ending it: run_from_ns
(where it began: the end of that gap, or the window's start), run_launch_ns (when that gap's launch call began; the
window's start at first) and run_idle_ns (the idle of the run's gaps that were not queued). DuckDB's window
operator over millions of operations costs several times the sort it needs, and spills on the largest exports; the
pass reads at most device_pass.ROWS_PER_CHUNK operations at a time, so memory stays flat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb
import numpy as np

from stallhound.analysis import device_pass, rules
from stallhound.analysis.common import Scope
from stallhound.analysis.fetch_ahead import FetchAhead
from stallhound.analysis.intervals import CATEGORY_LABELS
from stallhound.model import allocator

GAP_ID_STRIDE = 2**32  # a device in a window has far fewer operations than this
NO_TIME = np.iinfo(np.int64).max  # a launch end not traced (sorts after every traced one)
DRIVER_TIME = NO_TIME - 1  # the "launch end" of a migration the driver issued: no call launched it either
TOUCH_TIME = NO_TIME - 2  # ... and of one a host thread's touch caused (a page fault on the host)
NO_THREAD = -1  # pid/tid not traced

KERNEL_CAT, COPY_CAT, _, GRAPH_CAT = CATEGORY_LABELS
OPS = f"""ops AS (
  SELECT device_id, greatest(start_ns, $start) AS s, least(end_ns, $end) AS e, launch_start_ns, launch_end_ns, tiny,
         pid, tid, stream_id, cat
  FROM (SELECT device_id, start_ns, end_ns, launch_start_ns, launch_end_ns, duration_ns < $tiny AS tiny, pid, tid,
               stream_id, {KERNEL_CAT} AS cat FROM kernels
        UNION ALL SELECT device_id, start_ns, end_ns, CASE WHEN {rules.DRIVER_MIGRATION_SQL} THEN NULL
                                                           ELSE launch_start_ns END,
                         CASE WHEN {rules.DRIVER_MIGRATION_SQL} THEN $driver_time
                              WHEN {rules.HOST_TOUCH_SQL} AND launch_end_ns IS NULL THEN $touch_time
                              ELSE launch_end_ns END,
                         false, pid, tid, stream_id, {COPY_CAT} FROM memcpy
        UNION ALL SELECT device_id, start_ns, end_ns, launch_start_ns, launch_end_ns, false, pid, tid, stream_id,
                         {COPY_CAT} FROM memset
        UNION ALL SELECT device_id, start_ns, end_ns, launch_start_ns, launch_end_ns, false, pid, tid, stream_id,
                         {GRAPH_CAT} FROM graph_exec)
  WHERE device_id = $device AND end_ns > $start AND start_ns < $end AND end_ns > start_ns
    AND start_ns >= $raw_lo AND start_ns <= $hi)"""  # one chunk (device_pass.chunk_bounds), by stored start
CHUNK_SQL = "WITH " + OPS + """
SELECT s, e, coalesce(launch_end_ns, $no_time) AS le, coalesce(least(launch_start_ns, launch_end_ns), $no_time) AS ls,
       coalesce(tiny, false) AS tiny,
       coalesce(pid, $no_thread) AS pid, coalesce(tid, $no_thread) AS tid,
       coalesce(stream_id, 0) AS stream, stream_id IS NULL AS no_stream, cat  -- device_pass.CHUNK_SQL's columns
FROM ops"""
CREATE_SQL = """CREATE OR REPLACE TEMP TABLE idle_gaps (gap_id BIGINT, device_id INTEGER, start_ns BIGINT,
  end_ns BIGINT, duration_ns BIGINT, launch_end_ns BIGINT, tiny BOOLEAN, pid BIGINT, tid BIGINT, prev_pid BIGINT,
  prev_tid BIGINT, driver BOOLEAN, touched BOOLEAN, busy_from_ns BIGINT, run_from_ns BIGINT,
  run_launch_ns BIGINT, run_idle_ns BIGINT)"""
INSERT_SQL = """INSERT INTO idle_gaps SELECT gap_id, $device, start_ns, end_ns, end_ns - start_ns,
  CASE WHEN launch_end_ns < $touch_time THEN launch_end_ns END, tiny, nullif(pid, $no_thread),
  nullif(tid, $no_thread), nullif(prev_pid, $no_thread), nullif(prev_tid, $no_thread), launch_end_ns = $driver_time,
  touched, busy_from_ns, run_from_ns, run_launch_ns, run_idle_ns
FROM gap_chunk"""


class _Device:
    """One device's pass: the running maximum of end x 2 + tiny (the latest end, and whether an operation ending
    then is tiny), of end x 2 + touch (... whether one ending then is a host-touch migration), of end x 2 + traced
    with the thread of the last operation reaching it (prev), the starts of the runs (busy_from, run_from,
    run_launch), the unqueued idle so far and up to the run's start (idle_ns, run_base_ns) and the rows counted so
    far, carried from chunk to chunk; the queued gaps shorter than fold_below only counted and summed."""

    def __init__(self, device: int, start: int, fold_below: int) -> None:
        self.device, self.reach2, self.rows = device, start * 2, 1  # the window's start is row 1
        self.touch2, self.busy_from, self.run_from, self.run_launch = start * 2, start, start, start
        self.idle_ns, self.run_base_ns = 0, 0
        self.traced2, self.prev = start * 2, (NO_THREAD, NO_THREAD)
        self.fold_below, self.folded_gaps, self.folded_ns = fold_below, 0, 0

    def _prev(self, e: np.ndarray, pid: np.ndarray, tid: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """prev_pid/prev_tid of the gaps before the operations `at`: the thread of the last operation so far that
        ends latest, a traced one first among those ending together; none when no traced one ends then."""
        value = np.concatenate(([self.traced2], e * 2 + (tid != NO_THREAD)))
        reach = np.maximum.accumulate(value)
        last = np.maximum.accumulate(np.where(value == reach, np.arange(len(value)), 0))  # the latest reaching it
        pids, tids = np.concatenate(([self.prev[0]], pid)), np.concatenate(([self.prev[1]], tid))
        self.traced2, self.prev = int(reach[-1]), (int(pids[last[-1]]), int(tids[last[-1]]))
        traced = reach[at] % 2 == 1  # reach[at]: over the operations before `at` and the carried state
        return np.where(traced, pids[last[at]], NO_THREAD), np.where(traced, tids[last[at]], NO_THREAD)

    def _runs(self, start: np.ndarray, end: np.ndarray, launch: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
        """busy_from_ns, run_from_ns, run_launch_ns and run_idle_ns (module doc) of the gaps (start, end) whose next
        work's launch calls began and returned at `launch`."""
        launch_start, launch_end = launch
        ends_run, unqueued = launch_start > start, launch_end > start
        busy_from, run_from = (np.maximum.accumulate(np.concatenate(([carried], np.where(ends, end, 0))))
                               for carried, ends in ((self.busy_from, unqueued), (self.run_from, ends_run)))
        at_run = np.maximum.accumulate(np.concatenate(([-1], np.where(ends_run, np.arange(len(start)), -1))))
        run_launch = np.concatenate(([self.run_launch], launch_start))[at_run + 1]
        idle = self.idle_ns + np.concatenate(([0], np.cumsum(np.where(unqueued, end - start, 0))))
        base = np.maximum.accumulate(np.concatenate(([self.run_base_ns], np.where(ends_run, idle[1:], 0))))
        self.busy_from, self.run_from, self.run_launch = int(busy_from[-1]), int(run_from[-1]), int(run_launch[-1])
        self.idle_ns, self.run_base_ns = int(idle[-1]), int(base[-1])
        return {"busy_from_ns": busy_from[:-1], "run_from_ns": run_from[:-1], "run_launch_ns": run_launch[:-1],
                "run_idle_ns": idle[:-1] - base[:-1]}

    def chunk(self, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        order = np.lexsort((c["e"], c["s"]))
        s, e, le, ls, tiny, pid, tid = (c[k][order] for k in ("s", "e", "le", "ls", "tiny", "pid", "tid"))
        reach2 = np.maximum.accumulate(np.concatenate(([self.reach2], e * 2 + tiny)))
        before = reach2[:-1]  # the latest end x 2 + tiny before each operation
        touch2 = np.maximum.accumulate(np.concatenate(([self.touch2], e * 2 + (le == TOUCH_TIME))))
        at = np.flatnonzero(s > before // 2)  # the operations a gap ends at
        heads = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))  # runs of operations starting together
        run = np.searchsorted(heads, at, side="right") - 1
        start, end, launch_end = before[at] // 2, s[at], np.minimum.reduceat(le, heads)[run]
        runs = self._runs(start, end, (np.minimum.reduceat(ls, heads)[run], launch_end))
        fold = (launch_end <= start) & (end - start < self.fold_below)  # counted here, not written
        self.folded_gaps += int(fold.sum())
        self.folded_ns += int((end - start)[fold].sum())
        kept = ~fold
        at, run, start, end, launch_end = at[kept], run[kept], start[kept], end[kept], launch_end[kept]
        runs = {k: v[kept] for k, v in runs.items()}
        touched = (launch_end == TOUCH_TIME) & (touch2[:-1][at] % 2 == 1)  # a touched page on either side
        # a run's thread: of its traced operations, the first whose launch returned (untraced returns last)
        sizes = np.diff(np.append(heads, len(s)))
        key = np.where(tid != NO_THREAD, np.minimum(le, NO_TIME - 1), NO_TIME)
        best = np.minimum.reduceat(key, heads)
        firsts = np.flatnonzero(key == np.repeat(best, sizes))
        first_runs = np.repeat(np.arange(len(heads)), sizes)[firsts]  # ascending: each run's first is where it changes
        pick = firsts[np.concatenate(([True], first_runs[1:] != first_runs[:-1]))]
        traced = best[run] != NO_TIME
        found = {"gap_id": self.device * GAP_ID_STRIDE + self.rows + at, "start_ns": start, "end_ns": end,
                 "launch_end_ns": launch_end,
                 "tiny": np.logical_or.reduceat(tiny, heads)[run] | (before[at] % 2 == 1),
                 "pid": np.where(traced, pid[pick[run]], NO_THREAD), "tid": np.where(traced, tid[pick[run]], NO_THREAD),
                 "touched": touched, **runs}
        found["prev_pid"], found["prev_tid"] = self._prev(e, pid, tid, at)
        self.reach2, self.touch2, self.rows = int(reach2[-1]), int(touch2[-1]), self.rows + len(s)
        return found

    def last(self, end: int) -> dict[str, np.ndarray]:
        """The gap from the latest end to the window's end, if any (no operation after it)."""
        start = self.reach2 // 2
        one = start < end
        return {"gap_id": np.array([self.device * GAP_ID_STRIDE + self.rows] * one, dtype=np.int64),
                "start_ns": np.array([start] * one, dtype=np.int64), "end_ns": np.array([end] * one, dtype=np.int64),
                "launch_end_ns": np.array([NO_TIME] * one, dtype=np.int64),
                "tiny": np.array([self.reach2 % 2 == 1] * one, dtype=bool),
                "pid": np.array([NO_THREAD] * one, dtype=np.int64), "tid": np.array([NO_THREAD] * one, dtype=np.int64),
                "prev_pid": np.array([self.prev[0] if self.traced2 % 2 else NO_THREAD] * one, dtype=np.int64),
                "prev_tid": np.array([self.prev[1] if self.traced2 % 2 else NO_THREAD] * one, dtype=np.int64),
                "touched": np.array([False] * one, dtype=bool),
                "busy_from_ns": np.array([self.busy_from] * one, dtype=np.int64),
                "run_from_ns": np.array([self.run_from] * one, dtype=np.int64),
                "run_launch_ns": np.array([self.run_launch] * one, dtype=np.int64),
                "run_idle_ns": np.array([self.idle_ns - self.run_base_ns] * one, dtype=np.int64)}


@dataclass(frozen=True)
class Folded:
    """Per device, the queued gaps (launched before the device went idle) shorter than fold_below_ns: not in
    idle_gaps, only counted and summed, as callers that list no gap that short need no more of them (a Judge
    counts the others it takes)."""
    gaps: dict[int, int]
    ns: dict[int, int]


Judge = Callable[[int, dict[str, np.ndarray]], np.ndarray]  # (device, gaps) -> the gaps it counted itself


@contextmanager
def idle_gaps(con: duckdb.DuckDBPyConnection, scope: Scope, tiny_ns: int, fold_below_ns: int,
              slices: int | None = None, judge: Judge | None = None) -> Iterator[Folded]:
    """The temp table idle_gaps for `scope` while the block runs (kernels shorter than tiny_ns are tiny); with
    `slices`, the device passes of that many slices are computed from the same chunks (device_pass.remember); with
    `judge`, each chunk's gaps go to it first, and those it returns True for are not written."""
    con.execute(CREATE_SQL)
    try:
        passes = {d: _Device(d, scope.start_ns, fold_below_ns) for d in scope.devices}
        figures = _walk(con, scope, tiny_ns, passes, judge, slices)
        if slices is not None:
            device_pass.remember(con, scope, slices, figures)
        for device, d in passes.items():  # a device without work in the window idles all of it
            _insert(con, device, _unjudged(judge, device, d.last(scope.end_ns)))
        allocator.release()  # the pass's arrays, freed, would stay in the heap while the attribution's SQL runs
        yield Folded(gaps={d: p.folded_gaps for d, p in passes.items()}, ns={d: p.folded_ns for d, p in passes.items()})
    finally:
        con.execute("DROP TABLE IF EXISTS idle_gaps")


def _walk(con: duckdb.DuckDBPyConnection, scope: Scope, tiny_ns: int, passes: dict[int, _Device],
          judge: Judge | None, slices: int | None) -> dict[int, device_pass.DevicePass]:
    """Each device's work in start-time chunks, each read while the one before it is worked on: its gaps written to
    idle_gaps (but those the judge counted) and, with `slices`, its device figures added up."""
    chunks = device_pass.chunk_params(con, scope, {"start": scope.start_ns, "end": scope.end_ns, "tiny": tiny_ns,
                                                   "no_time": NO_TIME, "no_thread": NO_THREAD,
                                                   "driver_time": DRIVER_TIME, "touch_time": TOUCH_TIME})
    figures = {device: device_pass.DevicePass() for device, _ in chunks}
    with FetchAhead(con, CHUNK_SQL, [params for _, params in chunks]) as ahead:
        for (device, _), cols in zip(chunks, ahead, strict=True):
            if len(cols["s"]):
                gaps = _unjudged(judge, device, passes[device].chunk(cols))
                with ahead.using() as locked:
                    _insert(locked, device, gaps)
                if slices is not None:
                    figures[device].add_chunk(cols, scope, slices)
    return figures


def _unjudged(judge: Judge | None, device: int, gaps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if judge is None or not len(gaps["gap_id"]):
        return gaps
    keep = ~judge(device, gaps)
    return {k: v[keep] for k, v in gaps.items()}


def _insert(con: duckdb.DuckDBPyConnection, device: int, gaps: dict[str, np.ndarray]) -> None:
    if not len(gaps["gap_id"]):
        return
    con.register("gap_chunk", gaps)
    try:
        con.execute(INSERT_SQL, {"device": device, "no_thread": NO_THREAD, "driver_time": DRIVER_TIME,
                                 "touch_time": TOUCH_TIME})
    finally:
        con.unregister("gap_chunk")
