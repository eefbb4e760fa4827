"""Push/pop nesting depth of NVTX ranges, computed window by window of time with sorted integer keys instead of
an ordered SQL window over every open and close.

Push/pop ranges nest per thread, so a range's depth is the count of opens minus closes before it on its thread,
in time order; at one time, ranges that end there close first, then ranges open (outer first, i.e. later end
first, then in row order: two with the same times nest), then zero-length ranges close.

A window of time holds the ranges opening in it and the closes falling in it (of ranges opened in it or
before). A range's depth is then the ranges its thread had open when the window began (carried from the
windows before) plus the window's opens minus closes before it on its thread: its position among the window's
opens sorted by (thread, start, end desc, row), and the closes whose (thread, end, turn) key sorts below its
(thread, start, open turn) key. Each key packs into one int64: two sorts and one binary search per range, and
memory bounded by the window, not the export. Exports arrive in time order, so the stable sorts mostly merge
presorted runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Turns at one time on one thread, in the order they count: ranges that end there close, ranges open,
# zero-length ranges close (they opened at this very time).
CLOSE_FIRST, OPEN, CLOSE_LAST = 0, 1, 2
TURN_BITS = 2
KEY_LIMIT = 2**63  # int64 keys: threads x time span x turns must stay below it


@dataclass
class Window:
    """One window of time: the ranges opening in it (row id, thread, start, end) and the closes in it (thread,
    start, end of the range closing); threads are small non-negative ints below the carry's length."""

    rid: np.ndarray
    thread: np.ndarray
    start: np.ndarray
    end: np.ndarray
    close_thread: np.ndarray
    close_start: np.ndarray
    close_end: np.ndarray


def window_depths(window: Window, carry: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row ids, depths) of the window's ranges; `carry` (ranges open per thread as the window begins) is moved
    on to the window's end."""
    threads = len(carry)
    opens, closes, base = _keys(window, threads)
    order = np.argsort(opens, kind="stable")
    opens = opens[order]
    _order_twins(order, opens, window.rid, window.end)
    closes.sort(kind="stable")
    thread = window.thread[order]
    # depth at sorted position p: what the thread carried in, plus its opens before p, minus its closes keyed below
    depth = np.searchsorted(closes, opens, side="left")
    depth -= np.searchsorted(closes, base)[thread]
    np.subtract(np.arange(len(order)), depth, out=depth)
    depth -= np.searchsorted(opens, base)[thread]
    depth += carry[thread]
    carry += np.bincount(window.thread, minlength=threads) - np.bincount(window.close_thread, minlength=threads)
    return window.rid[order], depth


def _keys(window: Window, threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(open keys, close keys, each thread's lowest key): (thread, time, turn) packed into int64."""
    start, close_start, close_end = window.start, window.close_start, window.close_end
    times = [t for t in (start, close_end) if len(t)]
    first = min((int(t.min()) for t in times), default=0)
    span = max((int(t.max()) for t in times), default=0) - first + 1
    if threads * span << TURN_BITS >= KEY_LIMIT:  # damaged times far apart: rank them, order and ties kept
        ranked = np.unique(np.concatenate((start, close_start, close_end)))
        start, close_start, close_end = (np.searchsorted(ranked, t) for t in (start, close_start, close_end))
        first, span = 0, len(ranked)
    opens = (window.thread.astype(np.int64) * span + (start - first)) << TURN_BITS | OPEN
    turn = np.where(close_end > close_start, CLOSE_FIRST, CLOSE_LAST)
    closes = (window.close_thread.astype(np.int64) * span + (close_end - first)) << TURN_BITS | turn
    return opens, closes, np.arange(threads, dtype=np.int64) * span << TURN_BITS


def _order_twins(order: np.ndarray, opens: np.ndarray, rid: np.ndarray, end: np.ndarray) -> None:
    """Among ranges opening at one time on one thread (equal sorted `opens`), put the outer first (later end)
    then row order; `order` is changed in place."""
    same = opens[1:] == opens[:-1]
    if not same.any():
        return
    tied = np.flatnonzero(np.concatenate(([False], same)) | np.concatenate((same, [False])))
    members = order[tied]
    order[tied] = members[np.lexsort((rid[members], -end[members], opens[tied]))]
