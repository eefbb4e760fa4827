"""attribution: every idle nanosecond of a device gets exactly one cause; the causes add up to the idle time."""

from __future__ import annotations

import random
import sqlite3

import numpy as np
import pytest
from conftest import FIXTURE_IDS, FIXTURES
from modeldb import make_model, union_ns

from stallhound.analysis import attribution, common, rules

T = 1_000_000  # the tiny timeline starts here, so launch calls can come before it
ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def kernel(n: int, s: int, e: int, launch: tuple[int, int] | None) -> dict:
    row = {"device_id": 0, "stream_id": 7, "pid": 1, "tid": 7, "correlation_id": n, "start_ns": T + s,
           "end_ns": T + e, "short_name": f"k{n}", "name": f"k{n}", "category": "compute"}
    if launch:
        row.update(launch_api="cudaLaunchKernel", launch_start_ns=T + launch[0], launch_end_ns=T + launch[1])
    return row


def call(name: str, kind: str, s: int, e: int, corr: int | None = None) -> dict:
    return {"pid": 1, "tid": 7, "correlation_id": corr, "name": name, "kind": kind, "start_ns": T + s, "end_ns": T + e}


def copy(corr: int, s: int, e: int, direction: str, src: str, dst: str, nbytes: int) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "tid": 7, "correlation_id": corr, "start_ns": T + s,
            "end_ns": T + e, "bytes": nbytes, "direction": direction, "src_kind": src, "dst_kind": dst}


def timeline():
    """One device, one launching thread, one gap of each cause (see the comments for how each is built)."""
    kernels = [
        kernel(1, 0, 10_000, (-5_000, -1_000)),
        kernel(2, 20_000, 30_000, (-800, -500)),  # queued: launched before the device went idle at 10 us
        kernel(3, 40_000, 45_000, (32_000, 35_000)),  # sync: a device synchronize was running at 30 us
        kernel(4, 55_000, 58_000, (50_000, 52_000)),  # readback: a synchronize right after a 4-byte D2H copy
        kernel(5, 62_000, 100_000, (60_000, 61_000)),  # launch_tiny: k4 is a 3 us kernel
        kernel(6, 120_000, 150_000, (105_000, 108_000)),  # launch: a short gap before a late launch
        kernel(7, 250_000, 300_000, (200_000, 210_000)),  # jit: a module load over the whole gap
        kernel(8, 400_000, 450_000, (390_000, 395_000)),  # alloc: cudaMalloc covers 80% of the gap
        kernel(9, 550_000, 600_000, (545_000, 548_000)),  # host_comm: inside an MPI_Send NVTX range
        kernel(10, 700_000, 750_000, (692_000, 695_000)),  # host_wait: inside poll()
        kernel(11, 850_000, 900_000, (842_000, 845_000)),  # host_cpu: the thread ran on a CPU
        kernel(12, 1_000_000, 1_050_000, None),  # host_untraced: nothing seen, its launch not traced either
        kernel(13, 1_090_000, 1_130_000, (1_085_000, 1_088_000)),  # pageable_copy: a pageable cudaMemcpy ran
        kernel(14, 1_170_000, 1_200_000, (1_165_000, 1_168_000)),  # sync_copy: a pinned cudaMemcpy ran
    ]
    memcpy = [copy(50, 45_000, 46_000, "D2H", "device", "pinned", 4),
              copy(51, 1_050_000, 1_070_000, "H2D", "pageable", "device", 1 << 20),
              copy(52, 1_130_000, 1_150_000, "H2D", "pinned", "device", 1 << 20)]
    cuda_api = [call("cudaDeviceSynchronize", "sync", 25_000, 31_000),
                call("cudaMemcpyAsync", "memcpy", 41_000, 42_000, 50),
                call("cudaStreamSynchronize", "sync", 42_500, 47_000),
                call("cuModuleLoadData", "module", 145_000, 250_000),
                call("cudaMalloc", "alloc", 300_000, 380_000),
                call("cudaMemcpy", "memcpy", 1_040_000, 1_080_000, 51),
                call("cudaMemcpy", "memcpy", 1_125_000, 1_160_000, 52)]
    cuda_api += [call("cudaLaunchKernel", "launch", k["launch_start_ns"] - T, k["launch_end_ns"] - T,
                      k["correlation_id"]) for k in kernels if "launch_end_ns" in k]
    return make_model(
        kernels=kernels, memcpy=memcpy, cuda_api=cuda_api,
        nvtx=[{"pid": 1, "tid": 7, "text": "MPI_Send", "start_ns": T + 450_000, "end_ns": T + 540_000,
               "kind": "push_pop", "depth": 0}],
        os_runtime=[{"pid": 1, "tid": 7, "name": "poll", "start_ns": T + 600_000, "end_ns": T + 690_000}],
        sched=[{"pid": 1, "tid": 7, "time_ns": T + 750_000, "cpu": 0, "is_sched_in": True},
               {"pid": 1, "tid": 7, "time_ns": T + 840_000, "cpu": 0, "is_sched_in": False}])


def scope(con, **kw) -> common.Scope:
    return common.resolve_scope(con, common.ScopedParams(profile="t", **kw), default="gpu_active")


EXPECTED = {"queued": 10_000, "sync": 10_000, "readback": 9_000, "launch_tiny": 4_000, "launch": 20_000,
            "jit": 100_000, "alloc": 100_000, "host_comm": 100_000, "host_wait": 100_000, "host_cpu": 100_000,
            "host_untraced": 100_000, "pageable_copy": 20_000, "sync_copy": 20_000}
# A host activity claims only its own time in a gap: MPI_Send and poll() 90 us of their 100 us gaps; the rest of each,
# under one op's overhead before a late launch, is launch (as a gap without them would be). The cudaMalloc began its
# gap: a blocking call, it keeps its in-call idle and the turnaround after it (nothing else seen before the launch).
# A blocking call keeps its in-call idle and of its turnaround no more than the device's run of work inside the call
# before the gap (the rest is the late launch's): the sync 1 us inside (30-31) + 5 us (k2's 25-30 us inside it), 4 us
# launch_tiny (k3 is tiny); the readback 1 + 3.5 us (k3's 42.5-45 us and the copy inside the sync), 4.5 us
# launch_tiny; the pageable and pinned copies waited 30 and 25 us: their 10 us turnarounds whole.
SPLIT = {**{c: (ns, 1) for c, ns in EXPECTED.items()}, "host_comm": (90_000, 1), "host_wait": (90_000, 1),
         "sync": (6_000, 1), "readback": (4_500, 1), "launch_tiny": (4_000 + 4_000 + 4_500, 3),
         "launch": (20_000 + 10_000 + 10_000, 3)}


def test_attribution_one_cause_per_gap_on_a_tiny_timeline():
    con = timeline()
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: (t.ns, t.gaps) for c, t in idle.causes.items()} == SPLIT
    assert idle.idle_ns == sum(EXPECTED.values()) and idle.window_ns == 1_200_000
    assert (idle.causes["sync"].api, idle.causes["readback"].api) == ("cudaDeviceSynchronize", "cudaStreamSynchronize")


def test_attribution_window_clips_gaps_and_adds_the_edges():
    con = timeline()
    [idle] = attribution.attribute(con, scope(con, start_ns=T + 5_000, end_ns=T + 60_000)).devices.values()
    # k1 is cut at 5 us; the window ends inside the launch_tiny gap (58-62 us): the launch after it lies
    # outside the window, so that stretch is judged by host activity alone, and none was traced; the late launches
    # after the sync and the readback (SPLIT) 4 + 4.5 us
    assert {c: t.ns for c, t in idle.causes.items()} == {"queued": 10_000, "sync": 6_000, "readback": 4_500,
                                                          "launch_tiny": 8_500, "host_untraced": 2_000}


@pytest.mark.parametrize("returned_before_ns, copy_between, cause, sync_start, nbytes", [
    (rules.READBACK_FOLLOW_NS, False, "readback", 190_000, 4),  # the synchronize began right after the D2H returned
    (rules.READBACK_FOLLOW_NS, False, "readback", 190_000, rules.SMALL_READ_BYTES),  # a small read, at the limit
    (rules.READBACK_FOLLOW_NS, False, "sync", 190_000, rules.SMALL_READ_BYTES + 1),  # data, not a value: a plain sync
    (rules.READBACK_FOLLOW_NS + 1, False, "sync", 190_000, 4),  # ... too long after it
    (1_000, True, "sync", 190_000, 4),  # a pinned H2D copy call returned after the D2H one, before the synchronize
    (1_000, True, "sync", 200_000, 4),  # ... in the READBACK_FOLLOW_NS bucket before the synchronize's
])
def test_attribution_a_sync_is_a_readback_when_the_last_call_returned_before_it_is_a_small_d2h_copy(
        returned_before_ns, copy_between, cause, sync_start, nbytes):
    # the device goes idle at 200-201 us inside this synchronize, until k2 at 400 us
    d2h_end = sync_start - returned_before_ns
    calls = [call("cudaMemcpyAsync", "memcpy", d2h_end - 1_000, d2h_end, 50),
             call("cudaStreamSynchronize", "sync", sync_start, 300_000)]
    copies = [copy(50, 200_000, 201_000, "D2H", "device", "pinned", nbytes)]
    if copy_between:
        calls.append(call("cudaMemcpyAsync", "memcpy", sync_start - 600, sync_start - 500, 51))
        copies.append(copy(51, 195_000, 196_000, "H2D", "pinned", "device", 4))
    kernels = [kernel(1, 0, 200_000, (-5_000, -1_000)), kernel(2, 400_000, 410_000, (390_000, 392_000))]
    launches = [call("cudaLaunchKernel", "launch", k["launch_start_ns"] - T, k["launch_end_ns"] - T,
                     k["correlation_id"]) for k in kernels]
    con = make_model(kernels=kernels, memcpy=copies, cuda_api=calls + launches)
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    # the call's piece: 99 us inside it, then of the 90 us before the launch only the device's work it waited for
    # (from its start to 201 us: 11 or 1 us); the rest is the late launch's
    ns = 99_000 + 201_000 - sync_start
    assert {c: (t.ns, t.calls) for c, t in idle.causes.items()} == {cause: (ns, 1), "launch": (199_000 - ns, 0)}


def test_attribution_a_late_launch_after_a_little_untraced_host_work_is_launch_overhead():
    """0.5 ms of untraced host time before a launch that ends after the device went idle: the framework's
    per-op overhead; 1.5 ms of it could be anything (a pause, other work)."""
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 510_000, 520_000, (505_000, 508_000)),
                              kernel(3, 2_020_000, 2_030_000, (2_015_000, 2_018_000))])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: t.ns for c, t in idle.causes.items()} == {"launch": 500_000, "host_untraced": 1_500_000}


def test_attribution_operations_starting_or_ending_together_are_judged_together():
    """At 10 us a long kernel and a tiny one end together; at 20 us a kernel launched late (at 15 us) and one whose
    launch was not traced start together: the gap between is a launch between tiny kernels (neither untraced nor a
    plain launch), whichever tied operation comes first. The two short queued gaps after it count as two."""
    untraced = {**kernel(4, 20_000, 30_000, None), "tid": None}
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 8_000, 10_000, (-4_000, -3_000)),
                              kernel(3, 20_000, 40_000, (14_000, 15_000)), untraced,
                              kernel(5, 50_000, 60_000, (-900, -800)), kernel(6, 70_000, 80_000, (-700, -600))])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: (t.ns, t.gaps) for c, t in idle.causes.items()} == {"launch_tiny": (10_000, 1), "queued": (20_000, 2)}


@pytest.mark.parametrize("direction, cause, queued", [
    ("UVM_D2H", "user_prefetch", True),  # a prefetch the host asked for before it began to wait
    ("UVM_H2D", "speculative_prefetch", True),  # the driver's, around a fault of GPU work
    ("UVM_D2H", "page_fault", False),  # a host thread touched the page: the host's doing, as any copy it starts
])
def test_attribution_a_gap_inside_a_sync_before_a_driver_migration_is_queued(direction, cause, queued):
    """The device finishes k1 at 100 us inside a cudaStreamSynchronize (50-400 us); a migration no call launched runs
    at 180-200 us, the sync returns at 400 us and k2 follows at 450 us. The 80 us before the migration are the
    driver's (queued) unless the host caused it; the 250 us after it are the sync's, one call."""
    migration = {**copy(None, 180_000, 200_000, direction, "unknown", "unknown", 4096), "tid": None,
                 "migration_cause": cause}
    con = make_model(kernels=[kernel(1, 0, 100_000, (-5_000, -1_000)), kernel(2, 450_000, 460_000, (420_000, 425_000))],
                     memcpy=[migration], cuda_api=[call("cudaStreamSynchronize", "sync", 50_000, 400_000)])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    expected = {"queued": (80_000, 1, 0), "sync": (250_000, 1, 1)} if queued else {"sync": (330_000, 2, 1)}
    assert {c: (t.ns, t.gaps, t.calls) for c, t in idle.causes.items()} == expected


def _touch(s: int, e: int, cause: str = "page_fault", direction: str = "UVM_D2H") -> dict:
    return {**copy(None, s, e, direction, "unknown", "unknown", 4096), "tid": None, "migration_cause": cause}


@pytest.mark.parametrize("gap_ns, before, after, fault", [
    (4_900_000, "touch", "touch", True),  # between two pages the host faulted in: the faults' time
    (20_000, "touch", "touch", True),  # short: judged in the pass, the same rule
    (5_100_000, "touch", "touch", False),  # longer than a fault cycle: the host's own work between two reads
    (4_900_000, "kernel", "touch", False),  # the host's first read after GPU work: what it did before is its own
    (4_900_000, "touch", "kernel", False),  # the next kernel's launch is late: the host's, not a fault
    (4_900_000, "touch", "prefetch", False),  # a prefetch to the host is the host's call, not a fault
])
def test_attribution_the_idle_between_pages_the_host_faults_in_is_host_fault(gap_ns, before, after, fault):
    """k1 (0-10 us), then the stretch `before` (a host page fault's migration to the host, else a kernel), a gap of
    gap_ns, the stretch `after`, and k2 10 ms later: only a gap between two migrations a host touch caused, of at
    most FAULT_CYCLE_MAX_NS, is host_fault."""
    def op(what: str, s: int, n: int) -> tuple[list, list]:
        if what == "kernel":
            return [kernel(n, s, s + 1_000, (s - 3_000, s - 2_000))], []
        return [], [_touch(s, s + 1_000, "user_prefetch" if what == "prefetch" else "page_fault")]
    k_before, m_before = op(before, 20_000, 3)
    k_after, m_after = op(after, 21_000 + gap_ns, 4)
    end = 21_000 + gap_ns + 1_000
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), *k_before, *k_after,
                              kernel(2, end + 10_000_000, end + 10_010_000, (end + 9_000_000, end + 9_001_000))],
                     memcpy=[*m_before, *m_after])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert idle.ns("host_fault") == (gap_ns if fault else 0)
    assert sum(t.ns for t in idle.causes.values()) == idle.idle_ns


def loading(*calls: dict, other: tuple[dict, ...] = (), **tables) -> tuple[attribution.DeviceIdle,
                                                                           list[attribution.Gap]]:
    """k1 (0-10 us), then k2 at 5 ms, launched at 4.9-4.95 ms: a 4.99 ms gap of device 0, with the host calls and the
    `other` kernels (device 1) given."""
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 5_000_000, 5_010_000,
                                                                             (4_900_000, 4_950_000)), *other],
                     cuda_api=[call("cudaLaunchKernel", "launch", -5_000, -1_000, 1),
                               call("cudaLaunchKernel", "launch", 4_900_000, 4_950_000, 2), *calls], **tables)
    found = attribution.attribute(con, scope(con, device=0))
    [idle] = found.devices.values()
    return idle, found.long_gaps


def test_attribution_a_jit_gap_is_jit_only_while_loads_and_compiles_run():
    """Two 1 ms module loads and a 2 ms NVTX compile range holding one of them inside the 4.99 ms gap: jit for their
    union (2.5 ms), the rest of the gap judged as if they were not there (nothing traced)."""
    idle, [gap] = loading(call("cuModuleLoadData", "module", 1_000_000, 2_000_000),
                          call("cuLibraryLoadData", "module", 2_500_000, 3_500_000),
                          nvtx=[{"pid": 1, "tid": 7, "text": "FusionKernelRuntime::compileFusionParallel",
                                 "start_ns": T + 1_500_000, "end_ns": T + 3_000_000, "kind": "push_pop", "depth": 0}])
    assert {c: (t.ns, t.gaps) for c, t in idle.causes.items()} == {"jit": (2_500_000, 1),
                                                                   "host_untraced": (2_490_000, 1)}
    assert (gap.cause, gap.late_ns, gap.late_cause) == ("jit", 2_490_000, "host_untraced")


@pytest.mark.parametrize("earlier, cause", [(False, {"jit": 3_000_000, "host_untraced": 1_990_000}),
                                            (True, {"launch": 4_990_000})])
def test_attribution_a_long_launch_is_a_lazy_load_only_for_the_first_launch_of_its_kernel(earlier, cause):
    """k3's 3 ms launch call (1-4 ms) inside the gap: its module loads on its first launch (jit for the call's time);
    a kernel of the same name launched before had it loaded, so the long call waited on something else."""
    k3 = {**kernel(3, 4_960_000, 4_970_000, (1_000_000, 4_000_000)), "device_id": 1, "name": "k1" if earlier else "k3"}
    idle, _ = loading(call("cudaLaunchKernel", "launch", 1_000_000, 4_000_000, 3), other=(k3,))
    assert {c: t.ns for c, t in idle.causes.items()} == cause


@pytest.mark.parametrize("kernel_ns, cause", [
    (4_960_000, {"jit": 3_000_000, "host_untraced": 1_990_000}),  # after the call returned: loaded, then submitted
    (2_500_000, {"jit": 3_000_000, "host_untraced": 1_990_000}),  # half the call (LAZY_KERNEL_AFTER_SHARE) in
    (2_490_000, {"launch": 4_990_000}),  # just before half of it
    (1_012_000, {"launch": 4_990_000}),  # 12 us in (hta_old_format): submitted first, the rest is host time
])
def test_attribution_a_long_launch_is_a_lazy_load_only_when_its_kernel_began_late_in_it(kernel_ns, cause):
    """k3's first launch, a 3 ms call (1-4 ms) inside the gap: the driver loads a module before it submits the
    kernel, so a lazy load's kernel starts after most of the call; one that starts near the call's start was
    submitted at once, and the call's long rest is no load."""
    k3 = {**kernel(3, kernel_ns, kernel_ns + 10_000, (1_000_000, 4_000_000)), "device_id": 1}
    idle, _ = loading(call("cudaLaunchKernel", "launch", 1_000_000, 4_000_000, 3), other=(k3,))
    assert {c: t.ns for c, t in idle.causes.items()} == cause


@pytest.mark.parametrize("calls, causes", [
    # cuDNN's first use: streams created for 3 ms of the 4.99 ms gap: init for their time, the rest untraced
    ([("cudaStreamCreateWithFlags", 1_000_000, 3_000_000), ("cudaStreamCreateWithFlags", 2_500_000, 4_000_000)],
     {"init": 3_000_000, "host_untraced": 1_990_000}),
    ([("cudaEventCreate_v3020", 1_000_000, 3_500_000)], {"init": 2_500_000, "host_untraced": 2_490_000}),  # nsys
    ([("cudaStreamCreate", 1_000_000, 3_490_000)], {"host_untraced": 4_990_000}),  # under half of the gap
    ([("cudaStreamGetPriority", 1_000_000, 4_000_000)], {"host_untraced": 4_990_000}),  # a query creates nothing
])
def test_attribution_initialisation_covering_most_of_a_long_gap_is_init(calls, causes):
    """Calls that create a stream, event or context (attribution.INIT_CALLS) covering half of a gap of 1 ms or more
    claim their own time in it (init); the rest is judged as if they were not there."""
    idle, [gap] = loading(*(call(name, "other", s, e) for name, s, e in calls))
    assert {c: t.ns for c, t in idle.causes.items()} == causes
    assert gap.cause == next(iter(causes))


def test_attribution_initialisation_in_a_gap_under_a_millisecond_is_not_init():
    """A 0.6 ms gap that stream creation covers: too short to be a bubble, it stays the host's (late launch)."""
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 610_000, 620_000, (600_000, 605_000))],
                     cuda_api=[call("cudaLaunchKernel", "launch", -5_000, -1_000, 1),
                               call("cudaStreamCreateWithFlags", "other", 50_000, 550_000),
                               call("cudaLaunchKernel", "launch", 600_000, 605_000, 2)])
    [idle] = attribution.attribute(con, scope(con, device=0)).devices.values()
    assert "init" not in idle.causes and sum(t.ns for t in idle.causes.values()) == 600_000


def test_attribution_a_profiler_flush_in_the_launching_process_is_its_own_cause():
    """A 3 ms CUPTI buffer flush on the profiler's thread of the launching process (pid 1) inside the gap: the
    gap is the profiler's while it runs; another process's flush is nothing to this device."""
    flushes = [{"pid": 1, "tid": 99, "name": "CUPTI Buffer flush", "start_ns": T + 1_000_000, "end_ns": T + 4_000_000},
               {"pid": 2, "tid": 98, "name": "CUPTI Buffer flush", "start_ns": T + 500_000, "end_ns": T + 4_500_000}]
    idle, [gap] = loading(profiler_overhead=[{**f, "duration_ns": f["end_ns"] - f["start_ns"]} for f in flushes])
    assert {c: t.ns for c, t in idle.causes.items()} == {"profiler": 3_000_000, "host_untraced": 1_990_000}
    assert (gap.cause, gap.late_ns, gap.late_cause) == ("profiler", 1_990_000, "host_untraced")


R = 1_990_000  # late_resume's gap begins this much later than the 10 us it began at in a sync waiting 5 us of work


def late_resume(k1_ns: int = 10_000 + R, **tables) -> tuple[attribution.DeviceIdle, list[attribution.Gap]]:
    """The device runs dry at 2 ms inside a cudaDeviceSynchronize (5 us-2.001 ms) that waited for 2 ms of k1; the
    host launches again only at 7.98 ms, for a kernel at 7.99 ms: a 5.99 ms gap begun inside the sync, its host
    resuming 5 ms late. k1_ns: where k1, and the sync 1 us later, end (the gap starts then, still ending at 7.99 ms)."""
    con = make_model(kernels=[kernel(1, 0, k1_ns, (-5_000, -1_000)), kernel(2, 6_000_000 + R, 6_010_000 + R, (
                                  5_990_000 + R, 5_995_000 + R))],
                     cuda_api=[call("cudaDeviceSynchronize", "sync", 5_000, k1_ns + 1_000)], **tables)
    found = attribution.attribute(con, scope(con))
    [idle] = found.devices.values()
    return idle, found.long_gaps


def test_attribution_a_late_resume_after_a_sync_keeps_the_syncs_share():
    """The sync drained the queue, so it keeps the gap up to SYNC_RESUME_MAX_NS after it returned (1 ms + the 1 us
    it ran on after the device went idle); the 4.989 ms past that the host was late, with nothing traced. One call."""
    idle, [gap] = late_resume()
    assert {c: (t.ns, t.gaps, t.calls) for c, t in idle.causes.items()} == {"sync": (1_001_000, 1, 1),
                                                                             "host_untraced": (4_989_000, 1, 0)}
    assert (gap.cause, gap.blocked_in, gap.late_ns, gap.late_cause) == ("sync", "cudaDeviceSynchronize", 4_989_000,
                                                                        "host_untraced")
    assert idle.idle_ns == gap.end_ns - gap.start_ns == 5_990_000


@pytest.mark.parametrize("k1_ns, sync_ns", [
    (10_000, 1_000 + 5_000),  # the sync waited 5 us for k1 (5-10 us): only 5 us of the host's time after it
    (1_004_000, 1_000 + 999_000),  # ... 999 us: as much of the turnaround (1 ms at most)
    (1_005_000, 1_000 + 1_000_000),  # ... 1 ms
])
def test_attribution_a_syncs_turnaround_is_no_longer_than_the_work_it_waited_for(k1_ns, sync_ns):
    """With the sync gone, the host's work after it would run while the device ran what the sync waited for (k1
    from the sync's start to the gap's), and no longer: past that the device would idle anyway, the host being late.
    So the sync claims its in-call idle and at most that much turnaround: never more than its own time."""
    idle, [gap] = late_resume(k1_ns)
    assert {c: (t.ns, t.calls) for c, t in idle.causes.items()} == {"sync": (sync_ns, 1),
                                                                     "host_untraced": (gap.end_ns - gap.start_ns
                                                                                       - sync_ns, 0)}
    assert sync_ns <= k1_ns + 1_000 - 5_000  # the sync call's own time


@pytest.mark.parametrize("scale", [1, 10])  # a short gap (ShortGaps) and a long one (gap_causes.sql)
@pytest.mark.parametrize(("k1_thread", "sync_ns"), [
    (7, 10_000),  # k1 launched before the sync began: all of it the sync's wait, so its whole own time
    (8, 6_000),  # k1 launched by another thread inside the sync: only the work after k1's gap (4 us) is waited for
])
def test_attribution_a_syncs_wait_counts_from_its_start_when_the_run_was_asked_before(scale, k1_thread, sync_ns):
    """k0 runs 0-10 us; k1 (20-24 us) is launched only after the device idled at 10 us, so that gap ends the
    device's run of work (run_from 20 us); a sync runs 16-26 us and the device runs dry in it at 24 us; k2 lands at
    40 us. When k1's launch had begun before the sync began, the sync waited from its start (16 us): its in-call idle
    (2 us) and 8 us of turnaround, its own time; when k1 was launched inside it, the work it waited for is k1 alone."""
    k1_launch = (12_000, 15_000) if k1_thread == 7 else (17_000, 18_000)
    k1 = {**kernel(1, 20_000 * scale, 24_000 * scale, tuple(t * scale for t in k1_launch)), "tid": k1_thread}
    con = make_model(kernels=[kernel(0, 0, 10_000 * scale, (-5_000, -1_000)), k1,
                              kernel(2, 40_000 * scale, 50_000 * scale, (28_000 * scale, 33_000 * scale))],
                     cuda_api=[call("cudaStreamSynchronize", "sync", 16_000 * scale, 26_000 * scale)])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert (idle.causes["sync"].ns, idle.causes["sync"].calls) == (sync_ns * scale, 1)


def test_attribution_a_late_resume_on_a_cpu_is_host_cpu():
    """The host ran on a CPU, outside CUDA calls, for 4 of the 5.99 ms: the late resume is CPU work."""
    sched = [{"pid": 1, "tid": 7, "time_ns": T + t, "cpu": 0, "is_sched_in": i} for t, i in ((1_500_000 + R, True),
                                                                                          (5_500_000 + R, False))]
    idle, [gap] = late_resume(sched=sched)
    assert {c: t.ns for c, t in idle.causes.items()} == {"sync": 1_001_000, "host_cpu": 4_989_000}
    assert (gap.cause, gap.late_cause) == ("sync", "host_cpu")


def test_attribution_a_wait_covering_most_of_a_gap_claims_its_own_time_after_the_syncs_share():
    """A 4 ms poll() (1-5 ms) fills most of the gap (10 us-6 ms): it claims its own 4 ms, never more; the sync that
    began the gap keeps its share, its turnaround only until the poll begins (10 us-1 ms: 0.99 ms, not the full
    1 ms after it returned at 11 us); the 1 ms left is untraced: three pieces that never share a nanosecond."""
    idle, [gap] = late_resume(os_runtime=[{"pid": 1, "tid": 7, "name": "poll", "start_ns": T + 1_000_000 + R,
                                           "end_ns": T + 5_000_000 + R}])
    assert {c: t.ns for c, t in idle.causes.items()} == {"sync": 990_000, "host_wait": 4_000_000,
                                                         "host_untraced": 1_000_000}
    assert (gap.cause, gap.then_ns, gap.then_cause, gap.late_ns, gap.late_cause) == (
        "sync", 4_000_000, "host_wait", 1_000_000, "host_untraced")


def test_attribution_a_gap_begun_inside_a_long_blocking_call_names_it():
    """The device runs dry at 3.2 ms, 2.7 ms into a 4 ms cudaStreamSynchronize (its 1 ms join buckets span the
    gap's start; an earlier synchronize had returned): the gap is the stream sync's, named as its blocking call."""
    con = make_model(kernels=[kernel(1, 0, 3_200_000, (-5_000, -1_000)),
                              kernel(2, 4_700_000, 4_710_000, (4_600_000, 4_650_000))],
                     cuda_api=[call("cudaDeviceSynchronize", "sync", 100_000, 200_000),
                               call("cudaStreamSynchronize", "sync", 500_000, 4_500_000)])
    found = attribution.attribute(con, scope(con))
    [gap] = found.long_gaps
    assert (gap.start_ns, gap.end_ns, gap.cause, gap.blocked_in) == (T + 3_200_000, T + 4_700_000, "sync",
                                                                     "cudaStreamSynchronize")


def test_attribution_a_gap_begun_after_the_blocking_call_returned_is_not_blocked():
    """The same, but the stream synchronize returned at 3.1 ms, before the device ran dry: no blocking call."""
    con = make_model(kernels=[kernel(1, 0, 3_200_000, (-5_000, -1_000)),
                              kernel(2, 4_700_000, 4_710_000, (4_600_000, 4_650_000))],
                     cuda_api=[call("cudaStreamSynchronize", "sync", 500_000, 3_100_000)])
    [gap] = attribution.attribute(con, scope(con)).long_gaps
    assert (gap.blocked_in, gap.cause) == (None, "host_untraced")


def drained(first: str) -> dict:
    """k1 (0-10 us) runs dry at 10 us inside a cudaFree (2-40 us); a cudaMalloc follows (41-60 us), then `first`: a
    4-byte memset (issued at 61-64 us, run at 65-66 us) or a tiny kernel (launched at 61-64 us, run at 62-63 us,
    before its launch call returned), then k2, launched at 65-73 us, at 74 us."""
    calls = [call("cudaFree", "alloc", 2_000, 40_000), call("cudaMalloc", "alloc", 41_000, 60_000),
             call("cudaLaunchKernel", "launch", -5_000, -1_000, 1),
             call("cudaLaunchKernel", "launch", 65_000, 73_000, 2)]
    kernels = [kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 74_000, 90_000, (65_000, 73_000))]
    memset = []
    if first == "memset":
        calls.append(call("cudaMemset", "memset", 61_000, 64_000, 60))
        memset = [{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 7, "correlation_id": 60, "start_ns": T + 65_000,
                   "end_ns": T + 66_000, "bytes": 4, "launch_start_ns": T + 61_000, "launch_end_ns": T + 64_000}]
    else:
        calls.append(call("cudaLaunchKernel", "launch", 61_000, 64_000, 3))
        kernels.append(kernel(3, 62_000, 63_000, (61_000, 64_000)))
    return make_model(kernels=kernels, memset=memset, cuda_api=calls)


@pytest.mark.parametrize("first, causes", [
    # the 8 us before k2, after the memset ran, are k2's late launch: the device's run of work before them began
    # after the malloc returned (the memset), so the malloc waited for none of it
    ("memset", {"alloc": (55_000, 1), "launch": (8_000, 1)}),
    # ... here until the tiny kernel's launch returned (64 us): the gap after it (63-74 us) begins in the wake, but
    # k2 was launched later (73 us): it waits on its own launch, after a tiny kernel
    ("kernel", {"alloc": (52_000, 1), "launch_tiny": (11_000, 1)}),
])
def test_attribution_a_free_that_drains_the_queue_keeps_the_idle_until_the_first_launch_lands(first, causes):
    con = drained(first)
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: (t.ns, t.gaps) for c, t in idle.causes.items()} == causes


@pytest.mark.parametrize("name, causes", [
    ("cudaFree", {"alloc": 7_000, "launch": 4_000}),  # waits for the device, which runs dry inside it: 2 us in it, and
    # of its 9 us turnaround the 5 us of k1 it waited for (5-10 us); the rest is the late launch's
    ("cudaFreeAsync", {"launch": 11_000})])  # stream-ordered: never blocks the host
def test_attribution_a_short_gap_begun_inside_a_free_is_the_frees(name, causes):
    """k1 ends at 10 us inside the free (5-12 us); k2 is launched at 13-20 us and runs at 21 us."""
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 21_000, 40_000, (13_000, 20_000))],
                     cuda_api=[call(name, "alloc", 5_000, 12_000),
                               call("cudaLaunchKernel", "launch", 13_000, 20_000, 2)])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: t.ns for c, t in idle.causes.items()} == causes


@pytest.mark.parametrize("malloc, launch, causes", [
    # 77 us allocating, 13 us launching, the rest untraced: allocation claims its own 77 us, the rest is launch
    ((15_000, 92_000), (160_000, 173_000), {"alloc": 77_000, "launch": 88_000}),
    ((15_000, 40_000), (120_000, 173_000), {"launch": 165_000}),  # 25 us allocating, 53 us launching
])
def test_attribution_an_ops_overhead_is_its_allocation_when_that_is_the_most_seen(malloc, launch, causes):
    """A 165 us gap (10-175 us) before a late launch, begun before the cudaMalloc in it (as an eager op's Python
    runs before its allocator calls the driver): no activity covers half of it, so it is one op's overhead; its
    allocation, when that is the most the host is seen doing, for the allocation's own time only."""
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 175_000, 185_000, launch)],
                     cuda_api=[call("cudaMalloc", "alloc", *malloc), call("cudaLaunchKernel", "launch", *launch, 2)])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: t.ns for c, t in idle.causes.items()} == causes


@pytest.mark.parametrize("k2_ns, causes", [
    (2_200_000, {"alloc": (2_190_000, 1)}),  # 0.2 ms after the last call: its turnaround
    (3_500_000, {"alloc": (2_890_000, 1), "host_untraced": (600_000, 0)}),  # 1.5 ms after it: 1 ms turnaround
])
def test_attribution_a_gap_that_allocation_covers_is_alloc_for_the_allocations_own_time(k2_ns, causes):
    """The device runs dry at 10 us inside a cudaMalloc (5-100 us); a second one runs 0.2-2 ms and k2 lands at
    k2_ns: allocation covers most of the gap, so it is alloc for the calls' own time in it (the first's 90 us in-call,
    the second's 1.8 ms) and one turnaround after them (SYNC_RESUME_MAX_NS, as after any blocking call: the host
    gap between the calls included); past that the host did something untraced, not the allocation. One call began
    it."""
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)),
                              kernel(2, k2_ns, k2_ns + 10_000, (k2_ns - 100_000, k2_ns - 50_000))],
                     cuda_api=[call("cudaMalloc", "alloc", 5_000, 100_000), call("cudaMalloc", "alloc", 200_000,
                                                                                   2_000_000)])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: (t.ns, t.calls) for c, t in idle.causes.items()} == causes


@pytest.mark.parametrize("starts_ms, periodic", [
    ([10, 20, 30, 40], 4),  # four 2 ms gaps every 10 ms, host on a CPU: a periodic pattern
    ([10, 20], 0),  # two are not a pattern
    ([10, 14, 30, 36], 0),  # no steady period
])
def test_attribution_periodic_host_gaps(starts_ms, periodic):
    """The device is busy except for 2 ms gaps at `starts_ms`, in which the host runs on a CPU."""
    ms = 1_000_000
    edges = [0, *[t for s in starts_ms for t in (s * ms, s * ms + 2 * ms)], 50 * ms]
    kernels = [kernel(i, a, b, (a - 1_000, a - 500) if i else (-5_000, -1_000))
               for i, (a, b) in enumerate(zip(edges[::2], edges[1::2], strict=True))]
    sched = [{"pid": 1, "tid": 7, "time_ns": T + s * ms + d, "cpu": 0, "is_sched_in": d == 0}
             for s in starts_ms for d in (0, 1_980_000)]
    con = make_model(kernels=kernels, sched=sched)
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert (idle.causes["host_cpu"].gaps, idle.causes["host_cpu"].periodic_gaps) == (len(starts_ms), periodic)


# --- golden: real exports -----------------------------------------------------------------------------------
RAW_WORK_SQL = """
SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ?
UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ?
"""


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_attribution_causes_add_up_to_the_idle_time_of_the_raw_export(open_fixture, stem):
    """Idle = window - union of the device's work, read independently from the raw export."""
    con = open_fixture(stem).con
    s = scope(con)
    raw = sqlite3.connect(f"file:{FIXTURES / stem}.sqlite?mode=ro", uri=True)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master")}
    for device, idle in attribution.attribute(con, s).devices.items():
        sql = RAW_WORK_SQL if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables else RAW_WORK_SQL.split("UNION ALL")[0]
        if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
            sql += ' UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = ?'
        params = [device] * sql.count("?")
        work = [(max(a, s.start_ns), min(b, s.end_ns)) for a, b in raw.execute(sql, params)
                if b > s.start_ns and a < s.end_ns and b > a]
        assert idle.idle_ns == s.duration_ns - union_ns(work)
        assert sum(t.ns for t in idle.causes.values()) == idle.idle_ns
        assert all(0 <= t.long_ns <= t.ns and t.periodic_ns <= t.long_ns for t in idle.causes.values())


def test_attribution_gap_ids_are_unique_and_sort_by_device_and_time():
    """Gap ids come from each device's ordered pass (no sort of their own): the listed gaps, in id order, are in
    device and time order. Device 1 is given first and its kernels out of time order."""
    ms = 1_000_000
    busy = {1: [(4, 5), (0, 2)], 0: [(0, 1), (3, 4), (6, 7)]}  # ms; the window is 0-7 ms (GPU-active)
    kernels = [{**kernel(10 * d + i, a * ms, b * ms, None), "device_id": d}
               for d, spans in busy.items() for i, (a, b) in enumerate(spans)]
    con = make_model(kernels=kernels)
    gaps = attribution.attribute(con, scope(con)).long_gaps
    assert [(g.device, g.start_ns - T, g.end_ns - T) for g in gaps] == [(0, 1 * ms, 3 * ms), (0, 4 * ms, 6 * ms),
                                                                        (1, 2 * ms, 4 * ms), (1, 5 * ms, 7 * ms)]
    assert len({g.gap_id for g in gaps}) == 4 and [g.gap_id for g in gaps] == sorted(g.gap_id for g in gaps)


def _random_timeline(seed: int):
    """Two devices, two launching threads, short gaps mostly: launches traced, untraced (no thread) or queued,
    tiny kernels, synchronizes and copies of every kind (D2H, pageable, pinned, blocking or async) in between, and
    unified-memory migrations (by prefetch or page fault, to either side) after some of those calls."""
    rng = random.Random(seed)
    kernels, calls, copies, corr = [], [], [], 1000
    for device in (0, 1):
        t = 0
        for _ in range(150):
            t += rng.choice([0, 500, 2_000, 8_000, 30_000, 49_000, 50_000, 50_001, 51_000, 200_000, 1_500_000])
            length = rng.choice([1_000, 3_000, 20_000])
            tid = rng.choice([7, 8])
            launch = rng.choice([None, "queued", "late", "late"])
            k = kernel(corr, t, t + length, None if launch is None else
                       (t - 20_000, t - 15_000) if launch == "queued" else (t - 3_000, t - 1_000))
            k.update(device_id=device, tid=tid if launch else None)  # an untraced launch names no thread
            kernels.append(k)
            if launch:
                calls.append({**call("cudaLaunchKernel", "launch", k["launch_start_ns"] - T, k["launch_end_ns"] - T,
                                     corr), "tid": tid})
            corr += 1
            if rng.random() < 0.3:  # a blocking call begun before the kernel ended, returning after it
                name, kind = rng.choice([("cudaStreamSynchronize", "sync"), ("cudaMemcpyAsync", "memcpy"),
                                         ("cudaMemcpy", "memcpy"), ("cudaFree", "alloc"), ("cudaMalloc", "alloc")])
                s = t + length - rng.choice([0, 500, 1_000, 2_000])  # 1_000: may return as the gap begins
                calls.append({**call(name, kind, s, s + rng.choice([1_000, 10_000, 60_000]), corr), "tid": tid})
                if kind == "memcpy":
                    direction, src, dst = rng.choice([("D2H", "device", "pinned"), ("H2D", "pageable", "device"),
                                                      ("H2D", "pinned", "device")])
                    copies.append({**copy(corr, s + 100, s + 600, direction, src, dst, 4), "device_id": device,
                                   "tid": tid})
                corr += 1
                at = s + rng.choice([1_000, 10_000, 60_000]) + rng.choice([500, 3_000, 30_000])
                if kind != "alloc" and rng.random() < 0.5 and T + at not in {c["start_ns"] for c in calls
                                                                             if c["tid"] == tid}:
                    # an allocation after it, in the gap or after (a thread begins one call at a time)
                    calls.append({**call("cudaMalloc", "alloc", at, at + rng.choice([2_000, 20_000])), "tid": tid})
                if rng.random() < 0.5:  # a unified-memory migration no call launched: the driver's, or the host's
                    at = t + length + rng.choice([500, 3_000, 20_000, 70_000])
                    copies.append({**copy(None, at, at + 700, rng.choice(["UVM_H2D", "UVM_D2H"]), "unknown",
                                          "unknown", 4096), "device_id": device, "tid": None,
                                   "migration_cause": rng.choice(["user_prefetch", "page_fault"])})
            t += length
    return make_model(kernels=kernels, memcpy=copies, cuda_api=calls)


@pytest.mark.parametrize("seed", range(6))
def test_attribution_short_gaps_judged_in_the_pass_equal_the_sql_labelling(seed, monkeypatch):
    con = _random_timeline(seed)
    judged = attribution.attribute(con, scope(con))
    monkeypatch.setattr(attribution.ShortGaps, "__call__", lambda self, device, gaps: np.zeros(len(gaps["gap_id"]),
                                                                                               dtype=bool))
    assert attribution.attribute(con, scope(con)) == judged
    assert {c for d in judged.devices.values() for c in d.causes} >= {"launch", "launch_tiny", "host_untraced", "sync",
                                                                      "alloc"}


def held(copy_at: int, launched: tuple[int, int], tid: int = 8, name: str = "cudaMemcpyAsync",
         moved_at: int = 9_000_000) -> attribution.Attribution:
    """k1 (0-1 ms) runs dry at 1 ms; k2, launched at `launched` by thread 7, runs only at 8 ms; thread `tid` calls
    `name` at `copy_at` until 9.1 ms, a 4-byte device-to-pageable read whose transfer runs at `moved_at`."""
    kernels = [kernel(1, 0, 1_000_000, (-5_000, -1_000)), kernel(2, 8_000_000, 8_100_000, launched)]
    copies = [{**copy(60, moved_at, moved_at + 2_000, "D2H", "device", "pageable", 4), "tid": tid}]
    calls = [call("cudaLaunchKernel", "launch", *launched, 2),
             {**call(name, "memcpy" if "Memcpy" in name else "sync", copy_at, 9_100_000, 60), "tid": tid}]
    con = make_model(kernels=kernels, memcpy=copies, cuda_api=calls)
    return attribution.attribute(con, scope(con, start_ns=T, end_ns=T + 9_100_000))


@pytest.mark.parametrize("copy_at, launched, name, moved_at, cause", [
    # the read begins inside the gap (at 2 ms, 6 of its 7 ms) on another thread, k2 queued before it: held
    (2_000_000, (1_500_000, 1_600_000), "cudaMemcpyAsync", 9_000_000, "readback"),
    # the same read spanning the gap from its start: held, although k2 was queued before the gap began
    (500_000, (-900, -800), "cudaMemcpyAsync", 9_000_000, "readback"),
    # begun at 4.6 ms, it covers less than half the gap: not held (judged by thread 7, which did nothing seen)
    (4_600_000, (1_500_000, 1_600_000), "cudaMemcpyAsync", 9_000_000, "host_untraced"),
    # at 4.4 ms, just over half: held
    (4_400_000, (1_500_000, 1_600_000), "cudaMemcpyAsync", 9_000_000, "readback"),
    # k2 launched after the read began: thread 7's late launch, not the read's
    (2_000_000, (2_500_000, 2_600_000), "cudaMemcpyAsync", 9_000_000, "host_untraced"),
    # the transfer ran before the gap (beside k1): the read did not wait for the work after it
    (2_000_000, (1_500_000, 1_600_000), "cudaMemcpyAsync", 500_000, "host_untraced"),
    # a synchronize names no device and moves nothing: the gap stays thread 7's, and a queued one stays queued
    (2_000_000, (1_500_000, 1_600_000), "cudaStreamSynchronize", 9_000_000, "host_untraced"),
    (500_000, (-900, -800), "cudaStreamSynchronize", 9_000_000, "queued"),
])
def test_attribution_a_gap_a_blocking_copy_waits_through_is_held_by_it(copy_at, launched, name, moved_at, cause):
    """The device idles 1-8 ms with k2 queued (launched at `launched`) while another thread sits in a blocking read
    whose transfer runs after the gap: the read waited on work the trace does not show, so the gap is its cause."""
    found = held(copy_at, launched, name=name, moved_at=moved_at)
    gap = found.long_gaps[0]
    idle = found.devices[0].causes[cause]
    is_held = cause == "readback"
    assert (gap.start_ns, gap.end_ns, gap.cause, gap.held) == (T + 1_000_000, T + 8_000_000, cause, is_held)
    assert (idle.held_ns, idle.calls) == ((7_000_000, 1) if is_held else (0, 0))
    assert (gap.blocked_in, gap.tid) == (("cudaMemcpyAsync", 8) if is_held else (None, 7))


@pytest.mark.parametrize("mpi, causes", [
    ((500_000, 1_100_000), {"host_comm": 600_000, "host_cpu": 1_400_000}),  # 0.6 of 2 ms: its own time still
    ((2_500_000, 2_600_000), {"host_cpu": 2_000_000}),  # a range outside the gap claims none of it
])
def test_attribution_host_communication_claims_its_own_time_under_half_a_gap(mpi, causes):
    """A 2 ms gap (10 us-2.01 ms) with the thread on a CPU throughout: an MPI_Recv range inside it is communication
    for its own time, though it covers less than half the gap; the rest is CPU work, as without the range."""
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)),
                              kernel(2, 2_010_000, 2_020_000, (2_000_000, 2_005_000))],
                     cuda_api=[call("cudaLaunchKernel", "launch", 2_000_000, 2_005_000, 2)],
                     nvtx=[{"pid": 1, "tid": 7, "text": "MPI_Recv", "start_ns": T + mpi[0], "end_ns": T + mpi[1],
                            "kind": "push_pop", "depth": 0}],
                     sched=[{"pid": 1, "tid": 7, "time_ns": T + 10_000, "cpu": 0, "is_sched_in": True},
                            {"pid": 1, "tid": 7, "time_ns": T + 2_000_000, "cpu": 0, "is_sched_in": False}])
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: t.ns for c, t in idle.causes.items()} == causes


@pytest.mark.parametrize("malloc, causes", [
    # the sync returns at 14 us, the cudaMalloc runs 17-23 us: the sync keeps its in-call idle and turnaround until
    # the allocation begins (10-17 us), the allocation its own 6 us, the late launch the rest (23-40 us)
    ((17_000, 23_000), {"sync": (7_000, 1, 1), "alloc": (6_000, 1, 0), "launch": (17_000, 1, 0)}),
    # no allocation: the sync's in-call idle (4 us) and of its 26 us turnaround the 5 us of k1 it waited for; the
    # rest is the late launch's
    (None, {"sync": (9_000, 1, 1), "launch": (21_000, 1, 0)}),
    ((41_000, 45_000), {"sync": (9_000, 1, 1), "launch": (21_000, 1, 0)}),  # an allocation after the gap: none of it
])
def test_attribution_a_short_gap_is_cut_where_an_allocation_call_begins(malloc, causes):
    """k1 runs dry at 10 us inside a cudaStreamSynchronize (5-14 us); k2, launched at 25-33 us, lands at 40 us: a
    short gap (30 us), judged in the pass (ShortGaps) and by the labelling alike."""
    calls = [call("cudaStreamSynchronize", "sync", 5_000, 14_000),
             call("cudaLaunchKernel", "launch", -5_000, -1_000, 1),
             call("cudaLaunchKernel", "launch", 25_000, 33_000, 2)]
    calls += [call("cudaMalloc", "alloc", *malloc)] if malloc else []
    con = make_model(kernels=[kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 40_000, 60_000, (25_000, 33_000))],
                     cuda_api=calls)
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: (t.ns, t.gaps, t.calls) for c, t in idle.causes.items()} == causes


def test_attribution_a_sync_turnaround_ends_at_the_threads_first_os_call():
    """The sync (5-11 us) drained the queue at 10 us; the thread calls fwrite() 2 us after it returned and runs on a
    CPU until k2 lands at 6 ms: the sync keeps its in-call idle and those 2 us, the host's own work the rest."""
    sched = [{"pid": 1, "tid": 7, "time_ns": T + t + R, "cpu": 0, "is_sched_in": i} for t, i in ((15_000, True),
                                                                                              (5_900_000, False))]
    idle, [gap] = late_resume(os_runtime=[{"pid": 1, "tid": 7, "name": "fwrite", "start_ns": T + 13_000 + R,
                                           "end_ns": T + 14_000 + R}], sched=sched)
    assert {c: (t.ns, t.calls) for c, t in idle.causes.items()} == {"sync": (3_000, 1), "host_cpu": (5_987_000, 0)}
    assert (gap.cause, gap.late_ns, gap.late_cause) == ("sync", 5_987_000, "host_cpu")


@pytest.mark.parametrize("free_tid, free, causes", [
    # thread 8 (which launches work too) frees 1-5 ms while thread 7, which launched k2, shows nothing: allocation for
    # the free's own 4 ms, the rest untraced
    (8, (1_000_000, 5_000_000), {"alloc": 4_000_000, "host_untraced": 1_990_000}),
    (8, (1_000_000, 2_000_000), {"host_untraced": 5_990_000}),  # 1 of 5.99 ms: not what keeps the device idle
    (9, (1_000_000, 5_000_000), {"host_untraced": 5_990_000}),  # a thread that launches no work: not the device's
])
def test_attribution_a_gap_other_launching_threads_spend_allocating_is_alloc(free_tid, free, causes):
    """k1 runs dry at 10 us; thread 7 launches k2 at 5.99 ms (lands at 6 ms) and does nothing else seen; thread 8
    launches k3 beside k2 and calls cudaFree meanwhile: a framework's other thread (autograd's) freeing memory."""
    kernels = [kernel(1, 0, 10_000, (-5_000, -1_000)), kernel(2, 6_000_000, 6_010_000, (5_990_000, 5_995_000)),
               {**kernel(3, 6_002_000, 6_004_000, (5_996_000, 5_997_000)), "tid": 8}]  # beside k2
    calls = [call("cudaLaunchKernel", "launch", *k, n) for n, k in ((1, (-5_000, -1_000)), (2, (5_990_000, 5_995_000)))]
    calls += [{**call("cudaLaunchKernel", "launch", 5_996_000, 5_997_000, 3), "tid": 8},
              {**call("cudaFree", "alloc", *free), "tid": free_tid}]
    con = make_model(kernels=kernels, cuda_api=calls)
    [idle] = attribution.attribute(con, scope(con)).devices.values()
    assert {c: t.ns for c, t in idle.causes.items()} == causes
