"""Each device's work unions (busy, per time slice, per stream, per kind, 2+ kernels at once) from one pass in start
order, in numpy; gpu_utilization and shares read them.

DuckDB's window operator costs about three times the sort it needs for a running maximum over millions of
operations; numpy's running maximum over the fetched columns costs almost nothing. A device's work is read in
time chunks of at most ROWS_PER_CHUNK operations (by start), each running maximum carried from one chunk to the
next, so memory stays flat on the largest exports. Every figure is a union length, which does not depend on how
operations starting at the same time are ordered. Computed once per model, scope and slice count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from stallhound.analysis.common import Scope, per_model, scope_args
from stallhound.analysis.fetch_ahead import FetchAhead
from stallhound.analysis.intervals import GPU_WORK_CATEGORY, GPU_WORK_CATEGORY_CHUNK

# Operations read at a time (this pass and analysis/gap_pass.py): memory stays flat however many operations a device
# ran; at 250k the gap pass's arrays take 60 MB (BENCHMARKS-HISTORY.md has the measurements behind the size).
ROWS_PER_CHUNK = 250_000
DEFAULT_SLICES = 20  # slices of a window by default: the device pass the gap pass fills in passing, and
# gpu_utilization's timeline unless asked for another count
NONE = np.iinfo(np.int64).min  # the running maximum before any operation
KINDS = {"compute": (0, 1), "copy_kernel": (1,), "transfer": (2,), "communication": (3,)}  # shares' unions by cat

COUNT_SQL = "WITH " + GPU_WORK_CATEGORY + """
SELECT device_id, count(*), min(start_ns), max(start_ns) FROM gpu_work GROUP BY ALL"""
CHUNK_SQL = "WITH " + GPU_WORK_CATEGORY_CHUNK + """
SELECT coalesce(stream_id, 0) AS stream, stream_id IS NULL AS no_stream, cat, start_ns AS s, end_ns AS e
FROM gpu_work"""


@dataclass
class DevicePass:
    """One device's figures: (slice, busy, pieces crossing the slice's end) rows, as gpu_utilization's
    _busy_by_slice reads them; the kernel union; the time with 2+ kernels at once; each stream's union (None: no
    stream recorded); each KINDS union; the operations. `reach` holds the running maxima carried across chunks."""
    slices: list[tuple[int, int, list[tuple[int, int]]]] = field(default_factory=list)
    kernel_busy: int = 0
    overlap: int = 0
    streams: dict[int | None, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    ops: int = 0
    reach: dict[object, int] = field(default_factory=dict)

    def union(self, key: object, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For start-ordered intervals of the union named `key`: where each one's new part starts (past every end
        before it, this chunk's and earlier ones') and its length (<= 0: none)."""
        running = np.maximum.accumulate(np.concatenate(([self.reach.get(key, NONE)], e)))
        self.reach[key] = int(running[-1])
        new_start = np.maximum(s, running[:-1])
        return new_start, e - new_start

    def add_slices(self, s: np.ndarray, e: np.ndarray, start: int, buckets: int, width: int) -> None:
        ps, length = self.union("busy", s, e)
        new = length > 0
        ps, pe, length = ps[new], e[new], length[new]
        if not len(length):
            return
        first = (ps - start) * buckets // width
        spans: dict[int, list[tuple[int, int]]] = {}
        for i in np.flatnonzero((pe - 1 - start) * buckets // width > first).tolist():
            spans.setdefault(int(first[i]), []).append((int(ps[i]), int(pe[i])))
        heads = np.concatenate(([0], np.flatnonzero(np.diff(first)) + 1))  # pieces in start order: a run a slice
        for b, total in zip(first[heads].tolist(), np.add.reduceat(length, heads).tolist(), strict=True):
            self.slices.append((b, total, spans.pop(b, [])))

    def add_kernels(self, s: np.ndarray, e: np.ndarray) -> None:
        before = np.maximum.accumulate(np.concatenate(([self.reach.get("kernel", NONE)], e)))
        self.reach["kernel"] = int(before[-1])
        before = before[:-1]
        self.kernel_busy += int(np.maximum(e - np.maximum(s, before), 0).sum())
        two = before > s  # starts while an earlier kernel runs: 2+ at once until the earlier one's end
        _, length = self.union("overlap", s[two], np.minimum(e[two], before[two]))
        self.overlap += int(np.maximum(length, 0).sum())

    def add_streams(self, key: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        order = np.argsort(key, kind="stable")  # keeps start order within a stream
        key, s, e = key[order], s[order], e[order]
        cuts = np.flatnonzero(np.diff(key)) + 1
        for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(key)])).tolist(),
                          strict=True):
            stream = None if key[lo] == -1 else int(key[lo])
            _, length = self.union(("stream", stream), s[lo:hi], e[lo:hi])
            self.streams[stream] = self.streams.get(stream, 0) + int(np.maximum(length, 0).sum())

    def add_chunk(self, cols: dict[str, np.ndarray], scope: Scope, buckets: int) -> None:
        order = np.argsort(cols["s"], kind="stable")
        s, e, cat = cols["s"][order], cols["e"][order], cols["cat"][order]
        self.ops += len(s)
        self.add_slices(s, e, scope.start_ns, buckets, scope.duration_ns)
        kernel = cat != 2
        self.add_kernels(s[kernel], e[kernel])
        for kind, cats in KINDS.items():
            mine = np.isin(cat, cats)
            _, length = self.union(kind, s[mine], e[mine])
            self.kinds[kind] += int(np.maximum(length, 0).sum())
        self.add_streams(np.where(cols["no_stream"][order], -1, cols["stream"][order]), s, e)


def chunk_edges(n: int, first: int, last: int, rows: int) -> list[tuple[int, int]]:
    """(lo, hi) start-time ranges, inclusive, that cut [first, last] in equal spans, one per `rows` of the n
    operations (as many as evenly spread starts would need); equal starts share a chunk."""
    chunks = -(-n // rows)
    edges = [first + (last + 1 - first) * i // chunks for i in range(chunks + 1)]
    return [(lo, hi - 1) for lo, hi in zip(edges, edges[1:], strict=False)]


def chunk_params(con: duckdb.DuckDBPyConnection, scope: Scope, args: dict) -> list[tuple[int, dict]]:
    """Each device's work in `scope` cut into start-time chunks (device by device, in time order): per chunk, the
    device and `args` with the chunk's device and bounds, the parameters of a chunk query (CHUNK_SQL, the gap
    pass's). Every device with work has at least one."""
    counts = con.execute(COUNT_SQL, scope_args(scope)).fetchall()
    return [(device, {**args, "device": device, **chunk_bounds(scope, lo, hi)})
            for device, n, first, last in counts for lo, hi in chunk_edges(n, first, last, ROWS_PER_CHUNK)]


def chunk_bounds(scope: Scope, lo: int, hi: int) -> dict[str, int]:
    """Bound parameters ($raw_lo, $hi) that select, by stored start, the operations whose start clipped to the
    window lies in [lo, hi]: the first chunk also takes those that began before the window."""
    return {"raw_lo": lo if lo > scope.start_ns else NONE, "hi": hi}


def _key(scope: Scope, buckets: int) -> tuple:
    return "device_pass", tuple(scope.devices), scope.start_ns, scope.end_ns, buckets


def device_passes(con: duckdb.DuckDBPyConnection, scope: Scope, buckets: int) -> dict[int, DevicePass]:
    """Each device with work in the scope: its figures, its work read in start-time chunks (or taken from the idle
    gap pass over the same scope, which reads the same chunks: `remember`)."""
    def compute() -> dict[int, DevicePass]:
        chunks = chunk_params(con, scope, scope_args(scope))
        found = {device: DevicePass() for device, _ in chunks}
        with FetchAhead(con, CHUNK_SQL, [params for _, params in chunks]) as ahead:
            for (device, _), cols in zip(chunks, ahead, strict=True):
                if len(cols["s"]):
                    found[device].add_chunk(cols, scope, buckets)
        for d in found.values():
            d.reach.clear()
        return found
    return per_model(con, _key(scope, buckets), compute)


def remember(con: duckdb.DuckDBPyConnection, scope: Scope, buckets: int, found: dict[int, DevicePass]) -> None:
    """Keep passes computed elsewhere from the same chunks (every device with work, each chunk's CHUNK_SQL columns
    added in start-time order) for device_passes to return."""
    for d in found.values():
        d.reach.clear()
    per_model(con, _key(scope, buckets), lambda: found)
