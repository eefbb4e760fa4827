"""The idle attribution's pieces on real exports, against figures read independently from the raw data (sqlite3 on
the nsys export, json on the torch.profiler trace): a blocking call keeps its in-call idle and its turnaround only
until the host does its own work; a short gap is cut where an allocation call begins; a gap the launching thread
explains nothing of is allocation when the process's other launching threads allocate through it."""

from __future__ import annotations

import bisect
import gzip
import json
import sqlite3

import pytest
from conftest import FIXTURES

from corpus import sources
from stallhound.analysis import attribution, common
from stallhound.formats import open_profile

BY_NAME = {p.name: p for p in sources.load()}
WORK_SQL = """SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, "end" FROM
CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET"""


def _union(spans: list[tuple[int, int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _idle(work: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The stretches between the device's work, from its first start to its last end (the GPU-active window)."""
    busy = _union(work)
    return [(a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False) if b[0] > a[1]]


def _raw(path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _attributed(path, cache_root):
    con = open_profile(path, cache_dir=cache_root).con
    return con, common.resolve_scope(con, common.ScopedParams(profile="t"), default="gpu_active")


def _corpus(name: str):
    path = sources.stored(BY_NAME[name])
    if not path.is_file():
        pytest.skip(f"{name} is not restored here (make corpus-restore)")
    return sources.resolve(BY_NAME[name])


def test_gap_split_a_syncs_turnaround_ends_where_the_host_prints(cache_root):
    """CLUE (C++, T4): each of the 20 cudaStreamSynchronize calls drains the device, and about 1 us after it returns
    the thread calls fwrite() and prints for ~4.7 ms (CPU samples in verboseResults). The sync keeps the idle from
    the gap's start inside it to that first OS call, no more; before, 18.35 ms (1 ms of turnaround each)."""
    raw = _raw(FIXTURES / "clue_t4_report4.sqlite")
    idle = _idle(raw.execute(WORK_SQL).fetchall())
    syncs = raw.execute("""SELECT r.start, r."end", r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s
                           ON s.id = r.nameId WHERE s.value LIKE 'cudaStreamSynchronize%'""").fetchall()
    expected = 0
    for start, end, thread in syncs:
        [first_os] = raw.execute("""SELECT min(o.start) FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId
                                    WHERE o.globalTid = ? AND o.start >= ? AND s.value NOT LIKE 'ioctl%'""",
                                 (thread, end)).fetchone()  # ioctl: the driver's own
        cut = min(end + attribution.SYNC_RESUME_MAX_NS, first_os)
        expected += sum(min(e, cut) - s for s, e in idle if start <= s < end < e)
    con, scope = _attributed(FIXTURES / "clue_t4_report4.sqlite", cache_root)
    [device] = attribution.attribute(con, scope).devices.values()
    assert len(syncs) == 20 and expected == 311_478
    assert (device.causes["sync"].ns, device.causes["sync"].calls) == (expected, 20)


RUNS_SQL = """SELECT o.start, o."end", r."end" FROM ({work}) o LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
ON r.correlationId = o.correlationId""".format(work=WORK_SQL.replace('start, "end"', 'start, "end", correlationId'))
CALLS_SQL = """SELECT r.start, r."end", s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
ORDER BY r.start"""  # the programs below run their CUDA calls on one thread


def _runs(raw: sqlite3.Connection) -> list[tuple[int, int, int]]:
    """(start, end, run_start) of each idle stretch: run_start, where the device's run of work before it began (the
    end of the last stretch before it whose work after was launched only after it began: not queued)."""
    out, reach, run_start = [], None, None
    for s, e, launched in sorted(raw.execute(RUNS_SQL).fetchall()):
        if reach is not None and s > reach:
            out.append((reach, s, run_start))
            run_start = run_start if launched is not None and launched <= reach else s
        reach, run_start = max(reach or e, e), s if run_start is None else run_start
    return out


def _turnarounds(raw: sqlite3.Connection, blocking, cut=("-",)) -> tuple[int, int, int, int, list[tuple[int, ...]]]:
    """What the blocking calls (blocking(name, start): is it one) claim: for each idle stretch begun inside one, its
    in-call idle and the turnaround after it returned (1 ms at most, up to where a call named cut* begins), no longer
    than the device's run of work inside the call before the stretch. (calls, their own time, in-call idle,
    turnaround, the rest of those stretches as (start, end, claimed))."""
    calls = raw.execute(CALLS_SQL).fetchall()
    cuts = [c[0] for c in calls if c[2].startswith(cut)]
    mine = [(s, e) for s, e, name in calls if blocking(name, s)]
    starts, runs = [c[0] for c in mine], _runs(raw)
    inside = turn = 0
    rest = []
    for s, e, run_start in runs:
        i = bisect.bisect_right(starts, s) - 1
        if i < 0 or s >= mine[i][1]:
            continue
        b_start, b_end = mine[i]
        j = bisect.bisect_left(cuts, b_end)
        resume = min(b_end + attribution.SYNC_RESUME_MAX_NS, cuts[j] if j < len(cuts) else e)
        waited = s - max(b_start, run_start)
        piece = min(e, b_end) - s + min(max(0, min(e, resume) - b_end), waited)
        inside, turn = inside + min(e, b_end) - s, turn + piece - (min(e, b_end) - s)
        rest.append((s, e, piece))
    return len(mine), sum(e - s for s, e in mine), inside, turn, rest


def test_gap_split_a_short_gap_is_cut_where_the_loops_allocation_begins(cache_root):
    """The OpenACC loop: each short gap begins in cuStreamSynchronize; the thread's next call is cuMemAlloc, then the
    launch. The sync's piece is its in-call idle and its turnaround, cut where the allocation begins, no longer than
    the device's work the sync waited for (the 1 KB copy); the allocation claims its own time, the launch the rest.
    Before, the sync's piece ran to the allocation whatever it waited for (14.07 ms for syncs that take 10.34 ms), and
    earlier the whole gap was the sync's (55.5 ms)."""
    path = _corpus("openaccpol_fill_allocloop")
    raw = _raw(path)
    n, own, inside, turn, rest = _turnarounds(raw, lambda name, _: name == "cuStreamSynchronize", ("cuMemAlloc",))
    calls = raw.execute(CALLS_SQL).fetchall()
    starts = [c[0] for c in calls]
    alloc_ns = split = 0
    for s, e, _ in rest:
        if e - s <= attribution.LAUNCH_GAP_MAX_NS:
            after = calls[bisect.bisect_right(starts, s)]  # the call after the sync
            alloc_ns += min(e, after[1]) - after[0] if after[2].startswith("cuMemAlloc") and after[0] < e else 0
            split += after[2].startswith("cuMemAlloc") and after[0] < e
    con, scope = _attributed(path, cache_root)
    with attribution.labelled_inputs(con, scope, attribution.FOLD_BELOW_NS) as (_, short):
        counted = {(cause, call): tuple(n) for (_, cause, call), n in short.counted.items()}
    [device] = attribution.attribute(con, scope).devices.values()
    assert (n, own, inside, turn, len(rest)) == (1_943, 10_342_385, 6_048_502, 2_228_748, 1_873)
    assert (device.causes["sync"].ns, device.causes["sync"].calls) == (inside + turn, 1_873) and inside + turn < own
    assert (alloc_ns, split) == (12_297_870, 1_869)
    assert counted[("alloc", None)] == (split, alloc_ns)


def test_gap_split_a_reads_turnaround_is_capped_at_the_work_it_waited_for(cache_root):
    """Balinski-Gomory (C++, RTX 3090): 2,455 small blocking reads (cudaMemcpyFromSymbol, 2 cudaMemcpy of 4 bytes)
    between tiny kernels. Each read claims its in-call idle and its turnaround after it returned, the next launch's
    latency included, no longer than the device's work it waited for (with the read gone, that is all the host's
    turnaround would overlap); the rest of the gap is launch overhead (launch_tiny). Before, the read kept the gap
    through the launch whatever it waited for: 35.04 ms for reads that take 27.99 ms; now 20.28 ms."""
    path = _corpus("balinski_gomory_tinykernels")
    raw = _raw(path)
    reads = {s for (s,) in raw.execute("""SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN
        CUPTI_ACTIVITY_KIND_MEMCPY m ON m.correlationId = r.correlationId WHERE m.copyKind = 2 AND m.bytes <= 1024""")}
    n, own, inside, turn, _ = _turnarounds(raw, lambda _, start: start in reads)
    con, scope = _attributed(path, cache_root)
    [device] = attribution.attribute(con, scope).devices.values()
    assert (n, own, inside, turn) == (2_455, 27_986_644, 17_510_401, 2_770_321)
    assert (device.causes["readback"].ns, device.causes["readback"].calls) == (inside + turn, 2_455)
    assert inside + turn < own


def test_gap_split_the_autograd_threads_frees_explain_the_gaps_the_launching_thread_waits_through(cache_root):
    """MI300X ResNet18 without the caching allocator: three gaps of 46-54 ms in which the main thread, which launched
    the work after them, shows nothing, while the autograd thread sits in hipFree. Each is allocation for the
    union of the process's hipMalloc/hipFree calls in it (json), the rest untraced; gpu-bubbles no longer has them."""
    path = _corpus("tl_mi300_resnet18_nopool")
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    frees = _union([(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in events
                    if e.get("cat") == "cuda_runtime" and e["name"] in ("hipMalloc", "hipFree")])
    con, scope = _attributed(path, cache_root)
    found = [g for g in attribution.attribute(con, scope).long_gaps if g.blocked_in is None and g.cause == "alloc"]
    assert [round((g.end_ns - g.start_ns) / 1e6, 1) for g in found] == [54.4, 46.6, 46.7]
    for g in found:
        inside = sum(max(0, min(e, g.end_ns) - max(s, g.start_ns)) for s, e in frees)
        assert g.pieces() == (("alloc", inside), (None, 0), ("host_untraced", g.end_ns - g.start_ns - inside),
                              (None, 0), (None, 0))
