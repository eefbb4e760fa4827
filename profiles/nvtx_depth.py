"""Push/pop nesting depth of NVTX ranges, computed with sorted integer keys instead of an ordered SQL window.

Push/pop ranges nest per thread, so a range's depth is the count of opens minus closes before it on its thread,
in time order; at one time, ranges that end there close first, then ranges open (outer first, i.e. later end
first, then in row order: two with the same times nest), then zero-length ranges close.

Every open has its close on its own thread, so counting over all threads in (thread, time) order gives each
thread's own count: opens before a range = its position among the opens sorted by (thread, start, end desc,
row), closes before it = the closes whose (thread, end, turn) key sorts below its (thread, start, open turn)
key. Each key packs into one int64 (thread, time since the first, turn): two sorts and one binary search per
range. Exports arrive in time order, so the stable sorts mostly merge presorted runs.
"""

from __future__ import annotations

import numpy as np

NO_DEPTH = -1  # depth of rows that are not closed push/pop ranges (marks, start/end, unclosed); NULL in the model
# Turns at one time on one thread, in the order they count: ranges that end there close, ranges open,
# zero-length ranges close (they opened at this very time).
CLOSE_FIRST, OPEN, CLOSE_LAST = 0, 1, 2
TURN_BITS = 2
KEY_LIMIT = 2**63  # int64 keys: threads x time span x turns must stay below it


def depths(rows: int, rid: np.ndarray, thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Depth of each of `rows` rows by row id (int32, NO_DEPTH where none), given the closed push/pop ranges:
    their row ids `rid` (0 <= rid < rows), `thread` (small non-negative ints, one per thread, in any order)
    and times (`end` >= `start`). The input arrays are consumed (changed in place)."""
    out = np.full(rows, NO_DEPTH, dtype=np.int32)
    if not len(rid):
        return out
    opens, closes = _keys(thread, start, end)
    del thread, start, end
    order = np.argsort(opens, kind="stable")
    opens = opens[order]
    _order_twins(order, opens, rid, closes)
    closes.sort(kind="stable")
    # depth at sorted position p: p opens before it, minus the closes keyed below it
    closed = np.searchsorted(closes, opens, side="left")
    del closes, opens
    np.subtract(np.arange(len(order)), closed, out=closed)
    out[rid[order]] = closed
    return out


def _keys(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(open key, close key) per range: (thread, time, turn) packed into int64, in place where it can be."""
    first = int(start.min())
    span = int(end.max()) - first + 1
    threads = int(thread.max()) + 1
    if threads * span << TURN_BITS >= KEY_LIMIT:  # damaged times far apart: rank them, order and ties kept
        times = np.unique(np.concatenate((start, end)))
        start, end = np.searchsorted(times, start), np.searchsorted(times, end)
        first, span = 0, len(times)
    base = thread.astype(np.int64, copy=False)
    base *= span
    base -= first
    turn = np.where(end > start, CLOSE_FIRST, CLOSE_LAST)
    closes = np.add(base, end, dtype=np.int64)
    closes <<= TURN_BITS
    closes |= turn
    del turn
    opens = np.add(base, start, out=base)
    opens <<= TURN_BITS
    opens |= OPEN
    return opens, closes


def _order_twins(order: np.ndarray, opens: np.ndarray, rid: np.ndarray, closes: np.ndarray) -> None:
    """Among ranges opening at one time on one thread (equal sorted `opens`), put the outer first (later end, read
    from its close key) then row order; `order` is changed in place."""
    same = opens[1:] == opens[:-1]
    if not same.any():
        return
    tied = np.flatnonzero(np.concatenate(([False], same)) | np.concatenate((same, [False])))
    members = order[tied]
    order[tied] = members[np.lexsort((rid[members], -(closes[members] >> TURN_BITS), opens[tied]))]
