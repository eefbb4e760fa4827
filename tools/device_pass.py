"""gpu_utilization's per-device unions from one start-ordered pass over each device's work, in numpy.

DuckDB's window operator costs about three times the sort it needs for a running maximum over millions of
operations; numpy's running maximum over the fetched, sorted columns costs almost nothing. A device's work
is read in time chunks of at most ROWS_PER_CHUNK operations (by start), with each running maximum carried
from one chunk to the next, so memory stays bounded on the largest exports. Every figure is a union length,
which does not depend on how operations starting at the same time are ordered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from nsightful.tools.common import Scope, scope_args
from nsightful.tools.intervals import GPU_WORK_FLAGGED

ROWS_PER_CHUNK = 2_000_000  # ~150 MB of arrays a chunk: flat memory however many operations a device ran
NONE = np.iinfo(np.int64).min  # the running maximum before any operation

COUNT_SQL = "WITH " + GPU_WORK_FLAGGED + """
SELECT device_id, count(*), min(start_ns), max(start_ns) FROM gpu_work GROUP BY ALL"""
CHUNK_SQL = "WITH " + GPU_WORK_FLAGGED + """
SELECT coalesce(stream_id, 0) AS stream, stream_id IS NULL AS no_stream, is_kernel AS k, start_ns AS s, end_ns AS e
FROM gpu_work WHERE device_id = $device AND start_ns >= $lo AND start_ns <= $hi"""


@dataclass
class DevicePass:
    """One device's figures: (slice, busy, spanning pieces) rows as gpu_utilization._busy_by_slice reads them, the
    kernel union, the time with 2+ kernels at once, and each stream's union (stream None: no stream recorded)."""
    slices: list[tuple[int, int, list[tuple[int, int]]]] = field(default_factory=list)
    kernel_busy: int = 0
    overlap: int = 0
    streams: dict[int | None, int] = field(default_factory=dict)
    # running maxima carried across chunks: all work, kernels, the 2+-kernel pieces, each stream
    reach: int = NONE
    kernel_reach: int = NONE
    overlap_reach: int = NONE
    stream_reach: dict[int | None, int] = field(default_factory=dict)


def _shifted_max(values: np.ndarray, carry: int) -> tuple[np.ndarray, int]:
    """For each row the maximum of `carry` and the values before it; and the new carry."""
    running = np.maximum.accumulate(np.concatenate(([carry], values)))
    return running[:-1], int(running[-1])


def _fresh(s: np.ndarray, e: np.ndarray, carry: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The start of each operation's new part (past every end before it) and its length (<= 0: none)."""
    before, carry = _shifted_max(e, carry)
    ps = np.maximum(s, before)
    return ps, e - ps, carry


def _chunk(d: DevicePass, cols: dict[str, np.ndarray], start: int, buckets: int, width: int) -> None:
    order = np.argsort(cols["s"], kind="stable")
    s, e, k = cols["s"][order], cols["e"][order], cols["k"][order]
    ps, length, d.reach = _fresh(s, e, d.reach)
    new = length > 0
    ps, pe, length = ps[new], e[new], length[new]
    if len(length):
        first = (ps - start) * buckets // width
        crossing = np.flatnonzero((pe - 1 - start) * buckets // width > first)
        spans: dict[int, list[tuple[int, int]]] = {}
        for i in crossing.tolist():
            spans.setdefault(int(first[i]), []).append((int(ps[i]), int(pe[i])))
        heads = np.concatenate(([0], np.flatnonzero(np.diff(first)) + 1))  # pieces run in start order: a run a slice
        for b, total in zip(first[heads].tolist(), np.add.reduceat(length, heads).tolist(), strict=True):
            d.slices.append((b, total, spans.pop(b, [])))
    ks, ke = s[k], e[k]
    before, d.kernel_reach = _shifted_max(ke, d.kernel_reach)
    d.kernel_busy += int(np.maximum(ke - np.maximum(ks, before), 0).sum())
    two = before > ks
    _, olen, d.overlap_reach = _fresh(ks[two], np.minimum(ke[two], before[two]), d.overlap_reach)
    d.overlap += int(np.maximum(olen, 0).sum())
    key = np.where(cols["no_stream"][order], -1, cols["stream"][order])
    by_stream = np.argsort(key, kind="stable")  # keeps start order within a stream
    key, s, e = key[by_stream], s[by_stream], e[by_stream]
    cuts = np.flatnonzero(np.diff(key)) + 1
    for lo, hi in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(key)])), strict=True):
        stream = None if key[lo] == -1 else int(key[lo])
        _, slen, d.stream_reach[stream] = _fresh(s[lo:hi], e[lo:hi], d.stream_reach.get(stream, NONE))
        d.streams[stream] = d.streams.get(stream, 0) + int(np.maximum(slen, 0).sum())


def device_passes(con: duckdb.DuckDBPyConnection, scope: Scope, buckets: int) -> dict[int, DevicePass]:
    """Each device's figures over the scope, its work read in start-time chunks."""
    args = scope_args(scope)
    found: dict[int, DevicePass] = {}
    for device, n, first, last in con.execute(COUNT_SQL, args).fetchall():
        d = found[device] = DevicePass()
        chunks = -(-n // ROWS_PER_CHUNK)
        edges = [first + (last + 1 - first) * i // chunks for i in range(chunks + 1)]
        for lo, hi in zip(edges, edges[1:], strict=False):
            cols = con.execute(CHUNK_SQL, {**args, "device": device, "lo": lo, "hi": hi - 1}).fetchnumpy()
            if len(cols["s"]):
                _chunk(d, cols, scope.start_ns, buckets, scope.duration_ns)
    return found
