"""The gap pass's judge of the short gaps (attribution.py): each one's cause, or pieces, counted and summed per device,
cause and call instead of written, as the labelling (gap_causes.sql) would give them."""

from __future__ import annotations

import numpy as np

from stallhound.analysis import gap_pass

UNBLOCKED = ("host_untraced", "launch_tiny", "launch")  # a short gap's cause with no blocking call, coded -1, -2, -3
UNCAPPED = ("pageable_copy", "small_copy")  # copies from host memory: the work itself, not a wait on earlier work, so
# their turnaround is not capped at the work they waited for (gap_causes.sql's piece_ns)


class ShortGaps:
    """The gap pass's judge (gap_pass.Judge) of the gaps LABELLED would only count: not queued and shorter than
    below_ns (the pass's fold limit, and at most attribution.LAUNCH_GAP_MAX_NS). Each gets the cause LABELLED gives it
    (the blocking call whose span or wake (CALLS_SQL) holds its start on its thread, else host_untraced when the work
    after it was not launched by a traced call, else launch_tiny or launch) and is counted and summed per (device,
    cause, call) instead of written: most gaps of a large export, which the labelling then no longer reads. A gap
    held by a call is cut in up to three pieces: the call's (piece_ns in gap_causes.sql: its in-call idle and its
    turnaround, until the allocation calls the thread then calls begin when the call allocates nothing, short_allocs),
    the allocation calls' own time (alloc), and the rest, the late launch (its unblocked cause)."""

    def __init__(self, spans: dict[str, np.ndarray], main_threads: dict[int, tuple[int, int]], below_ns: int,
                 resume_max_ns: int):
        self.below_ns, self.main_threads, self.resume_max_ns = below_ns, main_threads, resume_max_ns
        self.labels = sorted(set(spans["cause"].tolist()) | set(spans["name"].tolist()) - {None}
                             | {"queued", "host_fault"})
        ids = {label: i for i, label in enumerate(self.labels)}  # a call with no name: -1, as no call (NULL)
        self.spans: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
        cause = np.array([ids[c] for c in spans["cause"].tolist()], dtype=np.int64)
        name = np.array([ids.get(n, -1) for n in spans["name"].tolist()], dtype=np.int64)
        thread = np.stack([spans["pid"], spans["tid"]], axis=1).astype(np.int64)
        edges = np.flatnonzero(np.any(thread[1:] != thread[:-1], axis=1)) + 1  # SPANS_SQL sorts by thread, start
        for lo, hi in zip(np.concatenate(([0], edges)), np.concatenate((edges, [len(thread)])), strict=True):
            if hi > lo:
                self.spans[int(thread[lo, 0]), int(thread[lo, 1])] = (
                    spans["start_ns"][lo:hi], spans["until_ns"][lo:hi], spans["reach_ns"][lo:hi],
                    spans["end_ns"][lo:hi], cause[lo:hi], name[lo:hi])
        self.counted: dict[tuple[int, str, str | None], list[int]] = {}
        self.calls: dict[tuple[int, str], set[tuple[int, int, int]]] = {}  # (device, cause) -> (pid, tid, call start)

    def __call__(self, device: int, gaps: dict[str, np.ndarray]) -> np.ndarray:
        start, end, launch_end = gaps["start_ns"], gaps["end_ns"], gaps["launch_end_ns"]
        duration = end - start
        judged = (duration < self.below_ns) & ~(launch_end <= start)
        if not judged.any():
            return judged
        at = np.flatnonzero(judged)
        pid, tid = self._threads(device, {k: gaps[k][at] for k in ("pid", "tid", "prev_pid", "prev_tid")})
        untraced = launch_end[at] >= gap_pass.TOUCH_TIME
        touched = gaps["touched"][at]  # host_fault, whatever call the thread is in (gap_causes.sql)
        unblocked = np.where(untraced, -1, np.where(gaps["tiny"][at], -2, -3))  # UNBLOCKED
        cause = np.where(touched, self.labels.index("host_fault"), unblocked)
        call = np.full(len(at), -1)
        begins, ends, launched = start[at], end[at], launch_end[at]
        cut, alloc_ns = ends.copy(), np.zeros(len(at), dtype=np.int64)  # where the call's piece ends; then allocation
        driver = launched == gap_pass.DRIVER_TIME
        runs = tuple(gaps[k][at] for k in ("busy_from_ns", "run_from_ns", "run_launch_ns", "run_idle_ns"))
        uncapped = [self.labels.index(c) for c in UNCAPPED if c in self.labels]
        for key, (starts, untils, reaches, call_ends, causes, names) in self.spans.items():
            mine = np.flatnonzero((pid == key[0]) & (tid == key[1]) & ~touched)
            if not len(mine):
                continue
            span = np.searchsorted(starts, begins[mine], side="right") - 1
            pos = np.maximum(span, 0)
            own = np.isin(causes[pos], uncapped)
            ran = (runs[1][mine] < call_ends[pos]) | (runs[2][mine] <= starts[pos])  # work in the call's run
            woken = (begins[mine] < reaches[pos]) & (launched[mine] <= reaches[pos]) & (ran | own)  # CALLS_SQL's wake
            inside = (span >= 0) & ((begins[mine] < untils[pos]) | woken)
            cause[mine[inside]], call[mine[inside]] = causes[span[inside]], names[span[inside]]
            waited = inside & driver[mine] & (ends[mine] <= call_ends[pos])  # gap_causes.sql: queued
            cause[mine[waited]], call[mine[waited]] = self.labels.index("queued"), -1
            blocked = inside & ~waited
            for c, at_call in set(zip(causes[span[blocked]].tolist(), starts[span[blocked]].tolist(), strict=True)):
                self.calls.setdefault((device, self.labels[c]), set()).add((*key, at_call))
            split, b = mine[blocked], span[blocked]
            cut[split], alloc_ns[split] = self._allocs((starts, untils, causes), b, ends[split])
            cut[split] = np.minimum(cut[split], self._piece_end(
                begins[split], ends[split], (starts[b], call_ends[b]), tuple(r[split] for r in runs),
                ~own[blocked]))
        split = cut < ends
        rest = ends - cut - alloc_ns  # after the call's piece and the allocation calls' own time: the late launch
        self._count(device, cause, call, np.where(split, cut - begins, duration[at]))
        allocated = split & (alloc_ns > 0)
        self._count(device, np.full(int(allocated.sum()), self.labels.index("alloc") if allocated.any() else -1),
                    np.full(int(allocated.sum()), -1), alloc_ns[allocated])
        late = split & (rest > 0)
        self._count(device, unblocked[late], np.full(int(late.sum()), -1), rest[late])
        return judged

    def _piece_end(self, begins: np.ndarray, ends: np.ndarray, calls: tuple[np.ndarray, ...],
                   runs: tuple[np.ndarray, ...], capped: np.ndarray) -> np.ndarray:
        """Where the blocking call's piece of each gap ends (gap_causes.sql's piece_ns): its in-call idle, then its
        turnaround ($resume_max at most), no longer than the device's work in its run inside the call before the gap
        (the work the call waited for, which that host time, the next launch's latency included, would have
        overlapped: the run's span from the call's start less the idle of all the run's gaps, so never more than the
        work), where capped (not a copy from host memory, UNCAPPED)."""
        (call_starts, call_ends), (busy_from, run_from, run_launch, run_idle) = calls, runs
        after = np.maximum(begins, call_ends)
        stop = np.minimum(ends, call_ends + self.resume_max_ns)
        since = np.minimum(np.maximum(call_starts, busy_from), run_idle + np.where(
            run_launch > call_starts, np.maximum(call_starts, run_from), call_starts))  # the closer of the two runs
        waited = np.where(~capped, self.resume_max_ns, np.maximum(0, np.minimum(begins, call_ends) - since))
        return np.minimum(ends, after + np.minimum(np.maximum(0, stop - after), waited))

    def _allocs(self, spans: tuple[np.ndarray, ...], span: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
        """For gaps held by the thread's blocking calls `span` (ending at `ends`): where the first allocation call
        begun in the gap after its call begins (the gap's end: none, or the call allocates itself), and those calls'
        time in it, each until the thread's next blocking call (gap_causes.sql's short_allocs)."""
        starts, untils, causes = spans
        alloc = self.labels.index("alloc") if "alloc" in self.labels else -1
        at, total = ends.copy(), np.zeros(len(span), dtype=np.int64)
        live, j = causes[span] != alloc, span + 1
        while (live := live & (j < len(starts))).any():
            k = np.minimum(j, len(starts) - 1)
            live &= starts[k] < ends
            allocating = live & (causes[k] == alloc)
            at = np.where(allocating & (at == ends), starts[k], at)
            total += np.where(allocating, np.minimum(untils[k], ends) - starts[k], 0)
            j += 1
        return at, total

    def _count(self, device: int, cause: np.ndarray, call: np.ndarray, ns: np.ndarray) -> None:
        """Count and sum pieces of gaps per (device, cause, call) (cause < 0: UNBLOCKED; call < 0: none)."""
        for c, n in set(zip(cause.tolist(), call.tolist(), strict=True)):
            these = (cause == c) & (call == n)
            label = UNBLOCKED[-c - 1] if c < 0 else self.labels[c]
            sums = self.counted.setdefault((device, label, self.labels[n] if n >= 0 else None), [0, 0])
            sums[0] += int(these.sum())
            sums[1] += int(ns[these].sum())

    def _threads(self, device: int, g: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Each gap's thread as gap_thread picks it: the next work's, else the previous work's, else the device's
        main thread (NO_THREAD when it has none)."""
        main = self.main_threads.get(device, (gap_pass.NO_THREAD, gap_pass.NO_THREAD))
        own, prev = g["tid"] != gap_pass.NO_THREAD, g["prev_tid"] != gap_pass.NO_THREAD
        pid = np.where(own, g["pid"], np.where(prev, g["prev_pid"], main[0]))
        tid = np.where(own, g["tid"], np.where(prev, g["prev_tid"], main[1]))
        return pid, tid
