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
from conftest import FIXTURES, waited_ns, work_runs

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


RUNS_SQL = """SELECT o.start, o."end", r.start, r."end" FROM ({work}) o LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
ON r.correlationId = o.correlationId""".format(work=WORK_SQL.replace('start, "end"', 'start, "end", correlationId'))
CALLS_SQL = """SELECT r.start, r."end", s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
ORDER BY r.start"""  # the programs below run their CUDA calls on one thread


def _runs(raw: sqlite3.Connection) -> list[tuple[int, ...]]:
    """conftest.work_runs over the export's GPU-active window (its first start to its last end)."""
    tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master")}
    sql = RUNS_SQL if "CUPTI_ACTIVITY_KIND_MEMSET" in tables else RUNS_SQL.replace(
        ' UNION ALL SELECT start, "end", correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET', "")
    work = sorted(raw.execute(sql).fetchall())
    return work_runs(work, work[0][0], max(w[1] for w in work))


OS_CALLS_SQL = """SELECT o.start FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId WHERE s.value NOT LIKE 'ioctl%'"""


def _turnarounds(raw: sqlite3.Connection, blocking, cut=("-",),
                 os_calls: bool = False) -> tuple[int, int, int, int, list[tuple[int, ...]]]:
    """What the blocking calls (blocking(name, start): is it one) claim: for each idle stretch begun inside one, its
    in-call idle and the turnaround after it returned (1 ms at most, up to where a call named cut* begins, or with
    os_calls an OS call but the driver's ioctl), no longer than the device's work the call waited for
    (conftest.waited_ns). (calls, their own time, in-call idle, turnaround, the rest of those stretches as (start,
    end, claimed))."""
    calls = raw.execute(CALLS_SQL).fetchall()
    cuts = sorted([c[0] for c in calls if c[2].startswith(cut)]
                  + ([s for (s,) in raw.execute(OS_CALLS_SQL)] if os_calls else []))
    mine = [(s, e) for s, e, name in calls if blocking(name, s)]
    starts, runs = [c[0] for c in mine], _runs(raw)
    inside = turn = 0
    rest = []
    for s, e, *run in runs:
        i = bisect.bisect_right(starts, s) - 1
        if i < 0 or s >= mine[i][1]:
            continue
        b_start, b_end = mine[i]
        j = bisect.bisect_left(cuts, b_end)
        resume = min(b_end + attribution.SYNC_RESUME_MAX_NS, cuts[j] if j < len(cuts) else e)
        waited = waited_ns((b_start, b_end), s, tuple(run))
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
    assert (n, own, inside, turn, len(rest)) == (1_943, 10_342_385, 6_048_502, 4_045_206, 1_873)
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
    assert (n, own, inside, turn) == (2_455, 27_986_644, 17_510_401, 3_727_288)
    assert (device.causes["readback"].ns, device.causes["readback"].calls) == (inside + turn, 2_455)
    assert inside + turn < own


def test_gap_split_the_autograd_threads_frees_explain_the_gaps_the_launching_thread_waits_through(cache_root):
    """MI300X ResNet18 without the caching allocator: three gaps of 46-54 ms in which the main thread, which launched
    the work after them, shows nothing, while the autograd thread sits in hipFree. Each is allocation for the
    union of the process's hipMalloc/hipFree calls in it (json), the rest inside the main thread's Python frames that
    launched nothing (with_stack: host_python); gpu-bubbles no longer has them."""
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
        assert g.pieces() == (("alloc", inside), (None, 0), ("host_python", g.end_ns - g.start_ns - inside),
                              (None, 0), (None, 0))


SMALL_READS_SQL = """SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_MEMCPY m
ON m.correlationId = r.correlationId WHERE m.copyKind = 2 AND m.bytes <= 1024"""


@pytest.mark.parametrize(("name", "figures", "claimed"), [
    # 300 blocking 4-byte cudaMemcpy reads: the device runs relax (19 us), idles 7 us inside the read before its
    # 1.4 us copy (the copy's latency: the read had asked for it, so the run goes on), then idles until the next
    # iteration; before, that in-call gap ended the run and the turnaround was capped at the copy: 4.55 ms
    ("sync_alloc", (300, 10_524_491, 4_144_646, 2_940_035), 7_084_681),
    # 200 cudaMemcpyAsync reads into pageable memory (then a cudaStreamSynchronize): each claims its own time
    ("cupy_convergence", (200, 2_947_790, 877_929, 2_069_861), 2_947_790),
])
def test_gap_split_a_reads_own_copy_does_not_end_the_work_it_waited_for(cache_root, name, figures, claimed):
    """A read's wait counts the device's work from the read's start (its run began with work launched before the
    read began), its own copy's latency inside the call not cutting it; the allocation calls after the read cut its
    turnaround (sync_alloc's cudaFree, cudaMalloc). The claim stays within the reads' own time."""
    path = _corpus(name)
    raw = _raw(path)
    reads = {s for (s,) in raw.execute(SMALL_READS_SQL)}
    n, own, inside, turn, _ = _turnarounds(raw, lambda _, start: start in reads, ("cudaFree", "cudaMalloc"))
    con, scope = _attributed(path, cache_root)
    [device] = attribution.attribute(con, scope).devices.values()
    assert (n, own, inside, turn) == figures and inside + turn == claimed <= own
    assert device.causes["readback"].ns == claimed


def test_gap_split_a_sync_after_a_tiny_kernel_launched_before_it_claims_its_own_time(cache_root):
    """Rodinia gaussian: each Fan1 (3.5 us) is launched, then cudaThreadSynchronize (6 us) waits for it, then Fan2 is
    launched: the device idled before Fan1 (its launch began after the device went idle), so that gap ends its run,
    but Fan1's launch had begun before the sync did, so the sync waited from its start: its in-call idle and of its
    turnaround up to its own time (before: only Fan1's 3.5 us; sync 52.2 ms of triage's window). The turnaround stops
    where the thread enters an OS call (one pthread_mutex_lock of 0.86 ms)."""
    path = _corpus("rodinia_gaussian_fan")
    raw = _raw(path)
    n, own, inside, turn, rest = _turnarounds(raw, lambda name, _: name.startswith("cudaThreadSynchronize"),
                                              os_calls=True)
    con, scope = _attributed(path, cache_root)
    [device] = attribution.attribute(con, scope).devices.values()
    assert (n, own, inside, turn, len(rest)) == (8_190, 2_832_046_669, 11_562_162, 46_908_527, 8_180)
    assert (device.causes["sync"].ns, device.causes["sync"].calls) == (inside + turn, 8_180)
