"""unified_memory: managed-memory migrations by cause, what on-demand migration costs, and its finding."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURES
from modeldb import make_model, union_ns
from test_idle_evidence import corpus_profile

from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.tools import unified_memory as um

ON_DEMAND_CAUSES = ("COHERENCE", "PREFETCH", "EVICTION", "ACCESS_COUNTERS")  # CUPTI's names of the on-demand causes


def run(con, **kw) -> um.Result:
    return run_skill(con, um, um.Params(profile="t", **kw))


# --- the real profile: clue_t4_report4 (CLUE on a T4, managed memory with prefetches) -----------------------------

def _raw_clue() -> dict:
    """Independent figures from the raw export over the whole capture: sqlite3 and Python sweeps."""
    raw = sqlite3.connect(f"file:{FIXTURES / 'clue_t4_report4'}.sqlite?mode=ro", uri=True)
    migrations = raw.execute(f"""SELECT m.start, m."end", m.bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY m
        JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind JOIN ENUM_CUDA_UNIF_MEM_MIGRATION c ON c.id = m.migrationCause
        WHERE o.name LIKE '%UVM%' AND c.name IN ({", ".join(f"'CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_{n}'"
                                                         for n in ON_DEMAND_CAUSES)})""").fetchall()
    kernels = raw.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    memsets = raw.execute("""SELECT s.start, s."end", s.bytes, k.name FROM CUPTI_ACTIVITY_KIND_MEMSET s
        JOIN ENUM_CUDA_MEM_KIND k ON k.id = s.memKind""").fetchall()
    calls = dict(raw.execute("""SELECT regexp, count(*) FROM (SELECT CASE
        WHEN s.value LIKE 'cudaMemPrefetchAsync%' THEN 'prefetch' WHEN s.value LIKE 'cudaMallocManaged%' THEN 'managed'
        WHEN s.value LIKE 'cudaMemAdvise%' THEN 'advise' END AS regexp
        FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId) WHERE regexp IS NOT NULL
        GROUP BY 1""").fetchall())
    spans = [(s, e) for s, e, _ in migrations]
    on_demand = union_ns(spans)
    managed = [(s, e, b) for s, e, b, kind in memsets if kind.endswith("_MANAGED")]
    stalled = [(s, e, b) for s, e, b in managed if any(ms < e and me > s for ms, me in spans)]
    device = [(s, e, b) for s, e, b, kind in memsets if kind.endswith("_DEVICE")]
    bandwidth = sum(b for *_, b in device) / sum(e - s for s, e, _ in device)  # bytes per ns
    outside = union_ns(spans + [(s, e) for s, e, _ in stalled]) - on_demand
    return {"count": len(migrations), "bytes": sum(b for *_, b in migrations), "on_demand_ns": on_demand,
            "host_stall_ns": _host_stall_ns(raw),
            "exposed_ns": on_demand - (union_ns(spans) + union_ns(kernels) - union_ns(spans + kernels)),
            "stalled_count": len(stalled), "stalled_ns": sum(e - s for s, e, _ in stalled),
            "stalled_extra_ns": outside - int(sum(b for *_, b in stalled) / bandwidth),
            "prefetch": calls.get("prefetch", 0), "advise": calls.get("advise", 0), "managed": calls.get("managed", 0)}


def _host_stall_ns(raw: sqlite3.Connection) -> int:
    """The device's idle time in gaps of at most 5 ms whose operation before (the latest end) and after are both
    migrations to the host on demand or of unknown cause (copyKind 12, migrationCause 0, 2 or 3): a sweep in Python."""
    ops = [(s, e, False) for s, e in raw.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL')]
    ops += [(s, e, False) for s, e in raw.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET')]
    ops += [(s, e, bool(t)) for s, e, t in raw.execute(
        'SELECT start, "end", copyKind = 12 AND coalesce(migrationCause, 0) IN (0, 2, 3) '
        'FROM CUPTI_ACTIVITY_KIND_MEMCPY')]
    reach, touched, total = None, False, 0
    for s, e, touch in sorted(ops):
        if reach is not None and reach < s <= reach + 5_000_000 and touch and touched:
            total += s - reach
        if reach is None or e > reach:
            reach, touched = e, touch
        elif e == reach:
            touched = touched or touch
    return total


def test_unified_memory_clue_figures_match_the_raw_export(open_fixture):
    want = _raw_clue()
    got = run(open_fixture("clue_t4_report4").con)
    assert (got.migration_count, got.on_demand_count) == (500, want["count"]) == (500, 392)
    [d] = got.devices
    assert (d.on_demand_count, d.on_demand_bytes, d.on_demand_ns, d.exposed_ns) == (
        want["count"], want["bytes"], want["on_demand_ns"], want["exposed_ns"])
    assert (d.faulting_memsets, d.faulting_memset_ns, d.stalled_memset_ns) == (
        want["stalled_count"], want["stalled_ns"], want["stalled_extra_ns"])
    assert (got.prefetch_calls, got.advise_calls, got.managed_alloc_calls) == (
        want["prefetch"], want["advise"], want["managed"]) == (180, 0, 9)
    assert got.cpu_faults is None and d.gpu_faults is None and "--cuda-um-gpu-page-faults" in got.capture_faults
    assert {(r.cause, r.on_demand) for r in got.rows} == {
        ("user_prefetch", False), ("page_fault", True), ("speculative_prefetch", True)}


def test_unified_memory_clue_finding_claims_no_more_than_the_migrations_and_the_memsets_they_stall(open_fixture):
    want = _raw_clue()
    [f] = run(open_fixture("clue_t4_report4").con).findings
    assert f.root_cause == "unified-memory-migration" and f.device == 0
    assert want["host_stall_ns"] == 1_646_661  # 42 gaps between the 48 pages the host faulted in
    assert f.time_at_stake_ns == want["on_demand_ns"] + want["stalled_extra_ns"] + want["host_stall_ns"]
    # the events' own time, and the idle between the pages the host touched
    assert f.time_at_stake_ns <= want["on_demand_ns"] + want["stalled_ns"] + want["host_stall_ns"]
    assert set(f.tags) == {"prefetching", "memset"} and "180 prefetch calls" in f.title
    assert f"{want['count']} unified-memory migrations on demand" in f.title


def test_unified_memory_silent_without_migrations(open_fixture):
    got = run(open_fixture("pipit_saxpy_mpi_a100").con)
    assert (got.migration_count, got.devices, got.findings, got.capture_faults) == (0, [], [], None)


# --- tiny models: the rule's edges ---------------------------------------------------------------------------------

def mig(s: int, e: int, cause: str | None, direction: str = "UVM_H2D", nbytes: int = 4096) -> dict:
    return {"device_id": 0, "stream_id": 1, "pid": 1, "start_ns": s, "end_ns": e, "bytes": nbytes,
            "direction": direction, "src_kind": "unknown", "dst_kind": "unknown", "migration_cause": cause}


def kernel(s: int, e: int) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "start_ns": s, "end_ns": e, "short_name": "k", "name": "k"}


def memset(s: int, e: int, kind: str, nbytes: int) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "start_ns": s, "end_ns": e, "bytes": nbytes, "mem_kind": kind}


def api(s: int, name: str) -> dict:
    return {"pid": 1, "tid": 1, "name": name, "kind": "other", "start_ns": s, "end_ns": s + 5}


def test_unified_memory_user_prefetches_alone_are_no_finding():
    con = make_model(memcpy=[mig(i * 100, i * 100 + 50, "user_prefetch") for i in range(10)],
                     kernels=[kernel(0, 10), kernel(2000, 2010)], cuda_api=[api(0, "cudaMemPrefetchAsync")])
    got = run(con)
    assert (got.migration_count, got.on_demand_count, got.devices, got.findings) == (10, 0, [], [])


def test_unified_memory_counts_overlapping_migrations_once_and_kernels_hide_nothing_they_do_not_cover():
    con = make_model(memcpy=[mig(100, 300, "page_fault"), mig(200, 400, "speculative_prefetch"),
                             mig(600, 700, "eviction", "UVM_D2H")],
                     kernels=[kernel(0, 10), kernel(250, 650), kernel(2000, 2010)])
    [d] = run(con).devices
    assert (d.on_demand_count, d.on_demand_ns, d.exposed_ns) == (3, 400, 400 - 150 - 50)
    [f] = run(con).findings
    assert f.time_at_stake_ns == 400 and f.tags == []  # no prefetch call, no memset, host side 100 of 400 ns


def test_unified_memory_needs_recurring_migrations():
    con = make_model(memcpy=[mig(100, 900, "page_fault"), mig(1000, 1900, "page_fault")],
                     kernels=[kernel(0, 10), kernel(2000, 2010)])
    assert run(con).findings == [] and run(con).devices[0].on_demand_ns == 1700


def test_unified_memory_unknown_causes_are_on_demand_only_without_prefetch_calls():
    rows = [mig(i * 100, i * 100 + 50, None) for i in range(5)]
    plain = run(make_model(memcpy=rows, kernels=[kernel(0, 10), kernel(2000, 2010)]))
    assert plain.on_demand_count == 5 and plain.findings[0].time_at_stake_ns == 250
    prefetched = run(make_model(memcpy=rows, kernels=[kernel(0, 10), kernel(2000, 2010)],
                                cuda_api=[api(0, "cuMemPrefetchAsync")]))
    assert (prefetched.on_demand_count, prefetched.findings) == (0, [])


def test_unified_memory_a_managed_memset_over_a_fault_is_stalled_beyond_its_own_work():
    """Device memsets run at 10 bytes/ns: a 1,000-byte managed memset over 300-1,300 does 100 ns of work; 200 ns of it
    lie under migrations, so 700 ns are the stall. A managed memset that meets no fault is not counted."""
    migrations = [mig(300, 400, "page_fault"), mig(500, 600, "page_fault"), mig(5000, 5010, "page_fault")]
    memsets = [memset(300, 1300, "managed", 1000), memset(3000, 3100, "managed", 1000),
               memset(4000, 4100, "device", 1000)]
    [d] = run(make_model(memcpy=migrations, memset=memsets)).devices
    assert (d.faulting_memsets, d.faulting_memset_ns, d.memset_gb_per_s) == (1, 1000, 10.0)
    assert d.stalled_memset_ns == 1000 - 200 - 100 and d.on_demand_ns == 210
    without = run(make_model(memcpy=migrations, memset=memsets[:2])).devices[0]
    assert (without.faulting_memsets, without.stalled_memset_ns) == (1, 0)  # no reference: no claim past migrations


def test_unified_memory_gpu_fault_groups_mark_the_memsets_they_stall_and_are_counted():
    faults = [{"side": "gpu", "device_id": 0, "pid": 1, "start_ns": 2000, "end_ns": 2100, "faults": 7},
              {"side": "cpu", "device_id": None, "pid": 1, "start_ns": 2500, "end_ns": None, "faults": 1}]
    got = run(make_model(memcpy=[mig(100, 200, "page_fault"), mig(300, 400, "page_fault"), mig(500, 600, "page_fault")],
                         memset=[memset(1900, 2900, "managed", 100), memset(4000, 4100, "device", 1000)],
                         uvm_faults=faults))
    [d] = got.devices
    assert (d.gpu_faults, got.cpu_faults, d.faulting_memsets, d.stalled_memset_ns) == (7, 1, 1, 1000 - 10)
    assert got.findings[0].time_at_stake_ns == 300 + 990 and "memset" in got.findings[0].tags


@pytest.mark.parametrize("window", [(0, 350), (250, 10_000)])
def test_unified_memory_clips_to_the_window(window):
    con = make_model(memcpy=[mig(100, 300, "page_fault"), mig(200, 400, "page_fault"), mig(600, 700, "page_fault")],
                     kernels=[kernel(0, 10), kernel(2000, 2010)])
    d = run(con, start_ns=window[0], end_ns=window[1]).devices[0]
    # migrations starting in the window, their ends clipped to it
    assert d.on_demand_ns == {(0, 350): 250, (250, 10_000): 100}[window]


def test_unified_memory_the_idle_between_pages_the_host_faults_in_is_its_cost_not_cpu_work():
    """A kernel ends at 1,000 ns; the host then reads its result through page faults: each a 4 KB fault and the
    driver's 60 KB speculative migration right after it (to the host), 0.4 ms apart. The device idles between them
    because the host is stalled in the faults: those gaps (not the one after the kernel, whose side before is GPU
    work) are the migrations' cost, and the idle attribution gives none of it to the host's CPU work."""
    migrations, t = [], 2_000
    for _ in range(4):
        migrations += [mig(t, t + 1_000, "page_fault", "UVM_D2H"),
                       mig(t + 1_000, t + 3_000, "speculative_prefetch", "UVM_D2H", 61_440)]
        t += 400_000
    con = make_model(kernels=[kernel(0, 1_000)], memcpy=migrations)
    got = run(con)
    [d] = got.devices
    assert (d.on_demand_count, d.on_demand_ns) == (8, 4 * 3_000)
    assert d.host_stall_ns == 3 * (400_000 - 3_000)  # the 1,000 ns after the kernel is not the faults'
    [f] = got.findings
    assert f.time_at_stake_ns == 4 * 3_000 + 3 * 397_000 and "host-touch" in f.tags
    assert f.time_at_stake_ns <= migrations[-1]["end_ns"] - migrations[0]["start_ns"]  # the reading phase


@pytest.mark.parametrize("to_device, both", [(2, False), (3, True)])
def test_unified_memory_faults_both_ways_get_the_prefetch_each_way(to_device, both):
    """The host reads a result page by page (host-touch) after a kernel that faulted its inputs in: MIN_ON_DEMAND
    (3) on-demand migrations to the device or more make it both-ways, whose fix prefetches in each direction; two
    are a first touch of a buffer or two, and the host-touch fix alone stands."""
    migrations = [mig(100 + 10 * i, 105 + 10 * i, "page_fault", "UVM_H2D") for i in range(to_device)]
    t = 2_000
    for _ in range(4):
        migrations.append(mig(t, t + 1_000, "page_fault", "UVM_D2H"))
        t += 400_000
    [f] = run(make_model(kernels=[kernel(0, 1_000)], memcpy=migrations)).findings
    assert "host-touch" in f.tags and ("both-ways" in f.tags) == both


def test_unified_memory_csc746_vecadd_faults_both_ways(cache_root):
    """csc746_uvm_add_1thread (add<<<1, 1>>> on managed memory, A100): SQL: copyKind 11 (unified H2D) 12,288
    migrations 104.029 ms, all page_fault/speculative (migrationCause 2/3) while the kernel runs; copyKind 12
    (unified D2H) 6,144 migrations 50.987 ms from 30,613.731 to 32,471.775 ms after it (1,858.043 ms: 1,807.057 ms of
    device idle between them); no prefetch call. At stake: 104.029 + 1,858.043 = 1,962.073 ms; the fix prefetches
    both ways (to the device before the kernel, to the host before the check)."""
    path = corpus_profile("csc746_uvm_add_1thread",
                          "6a8676167e8f2af43bd05e1532773a7ed49030be17fac8611097957e529d3c61")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert raw.execute("""SELECT copyKind, count(*), sum("end" - start), max("end") - min(start)
                          FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1 ORDER BY 1""").fetchall() == [
        (11, 12_288, 104_029_168, 25_761_248_326), (12, 6_144, 50_986_862, 1_858_043_405)]
    raw.close()
    profile = open_profile(path, cache_dir=cache_root)
    try:
        got = run(profile.con)
    finally:
        profile.close()
    [f] = got.findings
    assert f.time_at_stake_ns == 104_029_168 + 1_858_043_405
    assert f.evidence["host_stall_ns"] == 1_858_043_405 - 50_986_862
    assert {"host-touch", "both-ways"} <= set(f.tags)
