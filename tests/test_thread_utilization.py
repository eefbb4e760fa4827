"""thread_utilization: busy time per CPU thread from sched events, CPU samples or traced calls."""

from __future__ import annotations

import sqlite3
import statistics
from collections import defaultdict

import pytest
from conftest import FIXTURES, dump
from modeldb import make_model

from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import thread_utilization as tu


def sched(tid: int, *switches: tuple[int, int], pid: int = 1) -> list[dict]:
    """Rows for (in, out) pairs of one thread."""
    return [{"pid": pid, "tid": tid, "time_ns": t, "cpu": 0, "is_sched_in": inside}
            for s, e in switches for t, inside in ((s, True), (e, False))]


def api(tid: int, s: int, e: int, name: str = "cudaLaunchKernel", kind: str = "launch", pid: int = 1) -> dict:
    return {"pid": pid, "tid": tid, "start_ns": s, "end_ns": e, "name": name, "kind": kind}


def run(con, **kw) -> tu.Result:
    return run_skill(con, tu, tu.Params(profile="t", **kw))


THREADS = [{"pid": 1, "tid": 1, "name": "main"}, {"pid": 1, "tid": 2, "name": "loader"}]


# --- unit ------------------------------------------------------------------------------------------
def test_thread_utilization_whole_result_from_sched():
    con = make_model(sched=sched(1, (0, 95), (98, 100)) + sched(2, (10, 20), (30, 35)), threads=THREADS)
    result = run(con)
    assert result.scope.model_dump() == {"profile": "t", "devices": [], "start_ns": 0, "end_ns": 100,
                                         "duration_ns": 100, "window_basis": "capture"}
    assert (result.basis, result.basis_meaning, result.sample_period_ns) == ("sched", tu.BASIS_MEANING["sched"], None)
    assert result.rows == [
        tu.ThreadRow(pid=1, tid=1, name="main", busy_ns=97, busy_pct=97.0, blocked_ns=0, net_busy_pct=97.0),
        tu.ThreadRow(pid=1, tid=2, name="loader", busy_ns=15, busy_pct=15.0, blocked_ns=0, net_busy_pct=15.0)]
    assert (result.thread_count, result.truncated, result.total_rows) == (2, False, 2)
    assert result.findings == []  # no GPU work in the capture: a busy thread starves nothing


def test_thread_utilization_discounts_time_spinning_in_blocking_calls():
    con = make_model(sched=sched(1, (0, 100)), cuda_api=[api(1, 10, 50, "cudaDeviceSynchronize", "sync"),
                                                          api(1, 40, 60, "cudaDeviceSynchronize", "sync"),
                                                          api(1, 60, 70, "cudaMemcpyAsync", "memcpy")])
    [row] = run(con).rows
    assert (row.busy_pct, row.blocked_ns, row.net_busy_pct) == (100.0, 50, 50.0)  # 10-60: one union


def test_thread_utilization_a_pageable_copy_blocks_even_when_async():
    """cudaMemcpyAsync from pageable memory stages the data through a pinned buffer before it returns: blocking;
    from pinned memory it returns at once."""
    copies = [{"device_id": 0, "stream_id": 7, "pid": 1, "correlation_id": c, "start_ns": s, "end_ns": s + 5,
               "bytes": 8, "direction": "H2D", "src_kind": src, "dst_kind": "device"}
              for c, s, src in ((1, 20, "pageable"), (2, 60, "pinned"))]
    calls = [{**api(1, 10, 40, "cudaMemcpyAsync", "memcpy"), "correlation_id": 1},
             {**api(1, 50, 80, "cudaMemcpyAsync", "memcpy"), "correlation_id": 2}]
    [row] = run(make_model(sched=sched(1, (0, 100)), cuda_api=calls, memcpy=copies)).rows
    assert (row.blocked_ns, row.net_busy_pct) == (30, 70.0)


def test_thread_utilization_sched_clips_to_the_window():
    con = make_model(sched=sched(1, (0, 60), (70, 100)) + sched(2, (0, 10)), threads=THREADS)
    result = run(con, start_ns=50, end_ns=80)
    assert [(r.tid, r.busy_ns, r.busy_pct) for r in result.rows] == [(1, 20, 66.67)]


def test_thread_utilization_cpu_samples_use_the_median_spacing():
    samples = [{"pid": 1, "tid": 1, "time_ns": t, "cpu": 0} for t in range(0, 200, 10)]  # 20 samples
    samples += [{"pid": 1, "tid": 2, "time_ns": t, "cpu": 1} for t in (0, 10, 50)]
    result = run(make_model(cpu_samples=samples, threads=THREADS))
    assert (result.basis, result.sample_period_ns) == ("cpu_samples", 10)
    assert [(r.tid, r.busy_ns, r.busy_pct) for r in result.rows] == [(1, 190, 100.0), (2, 30, 15.79)]


def test_thread_utilization_cuda_api_skips_syncs_and_waits():
    con = make_model(
        cuda_api=[api(1, 0, 10), api(1, 5, 20), api(1, 20, 80, "cudaStreamSynchronize", "sync"), api(1, 80, 90)],
        os_runtime=[{"pid": 1, "tid": 1, "name": "ioctl", "start_ns": 85, "end_ns": 95},
                    {"pid": 1, "tid": 2, "name": "pthread_cond_wait", "start_ns": 0, "end_ns": 100},
                    {"pid": 1, "tid": 2, "name": "write", "start_ns": 40, "end_ns": 50},
                    {"pid": 1, "tid": 2, "name": "read", "start_ns": 60, "end_ns": 75}],
        threads=THREADS)
    result = run(con)
    assert result.basis == "cuda_api"
    # [0,20] + [80,95]; the write (a read waits for its data, as in the idle attribution: rules.WAIT_CALLS)
    assert [(r.tid, r.busy_ns) for r in result.rows] == [(1, 35), (2, 10)]


def test_thread_utilization_cuda_api_basis_draws_no_finding():
    result = run(make_model(cuda_api=[api(1, 0, 100)]))
    assert (result.rows[0].busy_pct, result.findings) == (100.0, [])


@pytest.mark.parametrize("basis, expected", [("auto", "sched"), ("sched", "sched"), ("cpu_samples", "cpu_samples"),
                                             ("cuda_api", "cuda_api")])
def test_thread_utilization_basis_choice(basis, expected):
    con = make_model(sched=sched(1, (0, 50)), cpu_samples=[{"pid": 1, "tid": 1, "time_ns": t, "cpu": 0}
                                                            for t in (0, 10, 20)], cuda_api=[api(1, 0, 5)])
    assert run(con, basis=basis).basis == expected


def test_thread_utilization_missing_basis_is_an_error():
    with pytest.raises(InvalidRequest, match="no data for basis 'sched'.*available: cuda_api"):
        run(make_model(cuda_api=[api(1, 0, 5)]), basis="sched")


def test_thread_utilization_device_keeps_its_processes():
    kernels = [{"device_id": d, "stream_id": 7, "pid": d + 10, "tid": d + 10, "start_ns": 0, "end_ns": 5}
               for d in (0, 1)]
    con = make_model(kernels=kernels, cuda_api=[api(10, 0, 50, pid=10), api(11, 0, 30, pid=11)])
    assert [r.pid for r in run(con).rows] == [10, 11]
    assert [r.pid for r in run(con, device=1).rows] == [11]


def test_thread_utilization_limit_caps_rows():
    con = make_model(sched=[row for t in range(1, 6) for row in sched(t, (0, 10 * t))])
    result = run(con, limit=2)
    assert [r.tid for r in result.rows] == [5, 4] and (result.truncated, result.total_rows) == (True, 5)
    assert "3 more threads" in tu.render(result)


# --- golden on real exports ----------------------------------------------------------------------------
def raw(stem: str, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    rows = con.execute(sql).fetchall()
    con.close()
    return rows


@pytest.mark.parametrize("stem", ["clue_t4_report4", "fuser_h200_crossentropy", "pipit_saxpy_mpi_a100"])
def test_thread_utilization_sched_matches_raw_export(open_fixture, stem):
    busy: dict[int, int] = defaultdict(int)
    last_in: dict[int, int] = {}
    for start, is_in, gtid in raw(stem, "SELECT start, isSchedIn, globalTid FROM SCHED_EVENTS ORDER BY start"):
        if is_in:
            last_in[gtid] = start
        elif gtid in last_in:
            busy[gtid & 0xFFFFFF] += start - last_in.pop(gtid)
    result = run_skill(open_fixture(stem).con, tu, tu.Params(profile=stem, limit=500))
    assert result.basis == "sched"
    assert {r.tid: r.busy_ns for r in result.rows} == {t: b for t, b in busy.items() if b > 0}


@pytest.mark.parametrize("stem", ["clue_t4_report4", "pipit_saxpy_mpi_a100"])
def test_thread_utilization_samples_match_raw_export(open_fixture, stem):
    per_thread: dict[int, list[int]] = defaultdict(list)
    for start, gtid in raw(stem, "SELECT start, globalTid FROM COMPOSITE_EVENTS ORDER BY start"):
        per_thread[gtid & 0xFFFFFF].append(start)
    gaps = [b - a for ts in per_thread.values() for a, b in zip(ts, ts[1:], strict=False) if b > a]
    period = int(statistics.median(gaps))
    result = run_skill(open_fixture(stem).con, tu, tu.Params(profile=stem, basis="cpu_samples", limit=500))
    assert result.sample_period_ns == period
    assert {r.tid: r.busy_ns for r in result.rows} == {
        t: min(len(ts) * period, result.scope.duration_ns) for t, ts in per_thread.items()}


def test_thread_utilization_cuda_api_matches_raw_export(open_fixture):
    stem = "nsysai_h100_2gpu_1s"
    calls: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for s, e, gtid in raw(stem, """SELECT r.start, r."end", r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                                   JOIN StringIds n ON n.id = r.nameId WHERE n.value NOT LIKE '%ynchronize%'"""):
        calls[gtid & 0xFFFFFF].append((s, e))
    expected = {}
    for tid, spans in calls.items():
        total, reach = 0, None
        for s, e in sorted(spans):
            total += max(0, e - max(s, reach if reach is not None else s))
            reach = e if reach is None else max(reach, e)
        expected[tid] = total
    result = run_skill(open_fixture(stem).con, tu, tu.Params(profile=stem))
    assert result.basis == "cuda_api"
    assert {r.tid: r.busy_ns for r in result.rows} == expected


def test_thread_utilization_snapshot(open_fixture, snapshot):
    assert dump(run_skill(open_fixture("clue_t4_report4").con, tu, tu.Params(profile="p", limit=5))) == snapshot


# --- synthetic samples ------------------------------------------------------------------------------
def test_thread_utilization_demo_ranks_main_threads_first_and_stays_quiet(demo):
    profile, truth = demo
    result = run_skill(profile.con, tu, tu.Params(profile="demo"))
    assert result.basis == "cuda_api"
    assert {(r.pid, r.tid) for r in result.rows[:len(truth["ranks"])]} == {(r["pid"], r["tid"]) for r in truth["ranks"]}
    steady = run_skill(profile.con, tu, tu.Params(profile="demo", start_ns=truth["iterations"][1]["start_ns"],
                                           end_ns=truth["iterations"][-1]["end_ns"]))
    assert steady.findings == []  # nothing CPU-bound is planted in the steady iterations


def test_thread_utilization_quiet_on_clean(clean):
    profile, _ = clean
    result = run_skill(profile.con, tu, tu.Params(profile="clean"))
    # the launch threads sit in launch calls >90% (queue back-pressure): traced time, not CPU time
    assert result.basis == "cuda_api" and result.rows[0].busy_pct > 90 and result.findings == []


# --- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 3}, "device 3 is not in this profile"),
    ({"start_ns": 50, "end_ns": 40}, "is empty"),
    ({"start_ns": 1_000, "end_ns": 2_000}, "outside the capture"),
])
def test_thread_utilization_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(sched=sched(1, (0, 100))), **kw)


def test_thread_utilization_rejects_the_empty_export(open_fixture):
    with pytest.raises(InvalidRequest):
        run_skill(open_fixture("dynamicvit_empty_export").con, tu, tu.Params(profile="e"))
