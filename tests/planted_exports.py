"""Planted copies of a real nsys export, each with one change of known size: what the diff verdict tests compare.

planted(src, dst, change) copies the export and applies one change to the copy, in SQLite:
- stretch_all(factor): every timestamp x factor: the same work, uniformly slower (or faster);
- stretch_kernels(factor): each kernel's duration x factor, what follows it on its stream shifted by the time added;
  the host unchanged;
- slow_host(factor): on each thread, the host's own time between consecutive kernel launch calls (the gap less the
  time inside synchronizing calls) x factor, everything the thread does from a launch on shifted by what its gaps
  gained; GPU work replayed: it starts as long after its launch call's end, or its stream's previous operation's,
  as it did;
- duplicate_kernels(): each kernel runs twice, a copy right after it on its stream (no launch call of its own),
  what follows shifted: more work on the GPU, the host unchanged.

The exports here come from one process (correlation ids are unique in it, so a GPU operation joins its launch call by
correlationId alone); nsys times are ns from the session start, so a stretch about 0 keeps every time positive.
"""

from __future__ import annotations

import bisect
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

KERNEL, RUNTIME = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
GPU_TABLES = (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
TIME_COLUMNS = ("start", "end", "timestamp", "startTime", "stopTime", "duration")
THREAD_TABLES = (RUNTIME, "NVTX_EVENTS", "OSRT_API", "SCHED_EVENTS", "COMPOSITE_EVENTS", "PROFILER_OVERHEAD")
CALL_TABLES = ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",)  # timed rows keyed by their API call
SYNC_CALLS = "%Synchroniz%"  # the CUDA runtime's synchronizing calls, as nsys names them (with a version suffix)

Change = Callable[[sqlite3.Connection], None]


def planted(src: Path, dst: Path, change: Change) -> Path:
    shutil.copyfile(src, dst)
    with sqlite3.connect(dst) as con:
        change(con)
    con.close()
    return dst


def _tables(con: sqlite3.Connection) -> set[str]:
    return {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info('{table}')")]


def stretch_all(factor: float) -> Change:
    def change(con: sqlite3.Connection) -> None:
        for table in _tables(con) - {"TARGET_INFO_SESSION_START_TIME"}:  # that one holds wall-clock dates
            columns = [c for c in _columns(con, table) if c in TIME_COLUMNS]
            if columns:
                con.execute(f"UPDATE {table} SET " + ", ".join(
                    f'"{c}" = CAST(round("{c}" * {factor}) AS INTEGER)' for c in columns))
    return change


def _gpu_ops(con: sqlite3.Connection) -> list[tuple[str, int, int, int, int, int, int]]:
    """(table, rowid, device, stream, start, end, correlation id) of every GPU operation, in stream order."""
    ops = []
    for table in sorted(set(GPU_TABLES) & _tables(con)):
        ops += [(table, *row) for row in con.execute(
            f'SELECT rowid, deviceId, streamId, start, "end", correlationId FROM {table}')]
    return sorted(ops, key=lambda o: (o[2], o[3], o[4], o[5], o[0], o[1]))


def _move(con: sqlite3.Connection, table: str, rowid: int, start: int, end: int) -> None:
    con.execute(f'UPDATE {table} SET start = ?, "end" = ? WHERE rowid = ?', (start, end, rowid))


def stretch_kernels(factor: float) -> Change:
    def change(con: sqlite3.Connection) -> None:
        shift: dict[tuple[int, int], int] = {}
        for table, rowid, device, stream, start, end, _ in _gpu_ops(con):
            added = shift.get((device, stream), 0)
            longer = round((end - start) * (factor - 1)) if table == KERNEL else 0
            _move(con, table, rowid, start + added, end + added + longer)
            shift[(device, stream)] = added + longer
    return change


def duplicate_kernels() -> Change:
    def change(con: sqlite3.Connection) -> None:
        shift: dict[tuple[int, int], int] = {}
        for table, rowid, device, stream, start, end, _ in _gpu_ops(con):
            added = shift.get((device, stream), 0)
            _move(con, table, rowid, start + added, end + added)
            if table == KERNEL:
                con.execute(f'INSERT INTO {KERNEL} SELECT * FROM {KERNEL} WHERE rowid = ?', (rowid,))
                _move(con, KERNEL, con.execute("SELECT last_insert_rowid()").fetchone()[0], end + added,
                      end + added + end - start)
                added += end - start
            shift[(device, stream)] = added
    return change


def _launch_shifts(con: sqlite3.Connection, factor: float) -> dict[int, tuple[list[int], list[int]]]:
    """Per thread, the starts of its kernel launch calls in time order and the shift from each on: every gap's own
    time (less the synchronizing calls inside it) x (factor - 1), summed over the gaps before it."""
    launches = con.execute(f"""SELECT globalTid, start, "end" FROM {RUNTIME}
        WHERE correlationId IN (SELECT correlationId FROM {KERNEL}) ORDER BY 1, 2""").fetchall()
    syncs: dict[int, list[tuple[int, int]]] = {}
    for tid, start, end in con.execute(f"""SELECT r.globalTid, r.start, r."end" FROM {RUNTIME} r
            JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE ? ORDER BY 2""", (SYNC_CALLS,)):
        syncs.setdefault(tid, []).append((start, end))
    out: dict[int, tuple[list[int], list[int]]] = {}
    last_end: dict[int, int] = {}
    for tid, start, end in launches:
        starts, shifts = out.setdefault(tid, ([], []))
        if tid in last_end:
            gap = (last_end[tid], start)
            blocked = sum(max(0, min(e, gap[1]) - max(s, gap[0])) for s, e in syncs.get(tid, []))
            shifts.append(shifts[-1] + round((gap[1] - gap[0] - blocked) * (factor - 1)))
        else:
            shifts.append(0)
        starts.append(start)
        last_end[tid] = end
    return out


def _shift_at(shifts: dict[int, tuple[list[int], list[int]]], tid: int | None, time: int) -> int:
    """The shift of a thread's event at `time`: that of its last launch call starting at or before it."""
    starts, by = shifts.get(tid, ([], [])) if tid is not None else ([], [])
    i = bisect.bisect_right(starts, time) - 1
    return by[i] if i >= 0 else 0


def _shift_host(con: sqlite3.Connection, shifts: dict[int, tuple[list[int], list[int]]]) -> dict[int, tuple[int, int]]:
    """Move every host event by its thread's shift; returns each API call's (original end, shift) by correlation
    id, before the move."""
    calls = {corr: (end, _shift_at(shifts, tid, start)) for corr, tid, start, end in
             con.execute(f'SELECT correlationId, globalTid, start, "end" FROM {RUNTIME}')}
    for table in sorted(set(THREAD_TABLES) & _tables(con)):
        ends = '"end" = "end" + ?, ' if "end" in _columns(con, table) else ""
        rows = con.execute(f"SELECT rowid, globalTid, start FROM {table}").fetchall()
        moves = [(d, rowid) for rowid, tid, start in rows if (d := _shift_at(shifts, tid, start))]
        con.executemany(f"UPDATE {table} SET {ends}start = start + ? WHERE rowid = ?",
                        [(d, d, rowid) if ends else (d, rowid) for d, rowid in moves])
    for table in sorted(set(CALL_TABLES) & _tables(con)):
        rows = con.execute(f"SELECT rowid, correlationId FROM {table}").fetchall()
        con.executemany(f'UPDATE {table} SET start = start + ?, "end" = "end" + ? WHERE rowid = ?',
                        [(calls[c][1], calls[c][1], rowid) for rowid, c in rows if c in calls and calls[c][1]])
    return calls


def slow_host(factor: float) -> Change:
    def change(con: sqlite3.Connection) -> None:
        calls = _shift_host(con, _launch_shifts(con, factor))
        ends: dict[tuple[int, int], tuple[int, int]] = {}  # stream -> (original, new) end of its last operation
        for table, rowid, device, stream, start, end, corr in _gpu_ops(con):
            prev = ends.get((device, stream))
            launch = calls.get(corr)  # (original end, shift) of its launch call
            was = [t for t in (launch[0] if launch else None, prev[0] if prev else None) if t is not None]
            now = [t for t in (sum(launch) if launch else None, prev[1] if prev else None) if t is not None]
            new_start = max(now) + start - max(was) if was else start
            new_start = max(new_start, prev[1]) if prev else new_start
            _move(con, table, rowid, new_start, new_start + end - start)
            ends[(device, stream)] = (end, new_start + end - start)
    return change
