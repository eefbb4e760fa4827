"""analysis/rules.py: each cross-tool rule on its own, and the tools that apply it agreeing at its edges."""

from __future__ import annotations

import duckdb
import pytest
from modeldb import make_model

from stallhound.analysis import rules
from stallhound.analysis.common import Scope
from stallhound.tools import kernel_launch_overhead, memory_transfers, sync_analysis, top_kernels
from stallhound.tools.answers import answerers

SYNC_NAMES = {  # API name -> what it waits for
    "cudaDeviceSynchronize": "device", "cuCtxSynchronize": "device", "cudaThreadSynchronize": "device",
    "cudaStreamSynchronize": "stream", "cuStreamSynchronize_ptsz": "stream", "cudaEventSynchronize": "event",
    "cuEventSynchronize": "event", "cudaStreamWaitEvent": "other", "cudaMemcpy": "other"}


def test_rules_sync_scope_in_python_and_sql_agree():
    con = duckdb.connect()
    for name, scope in SYNC_NAMES.items():
        assert rules.sync_scope(name) == scope, name
        assert con.execute(f"SELECT {rules.sync_scope_sql('$n')}", {"n": name}).fetchone()[0] == scope, name
    assert rules.sync_scope(None) == "other"


def test_rules_sync_scope_counts_the_deprecated_thread_synchronize_as_device_wide():
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "start_ns": 0, "end_ns": 100}],
                     cuda_api=[{"pid": 1, "tid": 1, "name": "cudaThreadSynchronize", "kind": "sync",
                                "start_ns": 100, "end_ns": 300}])
    result = sync_analysis.run(con, sync_analysis.Params(profile="t"))
    assert [(a.api_name, a.scope_kind) for a in result.apis] == [("cudaThreadSynchronize", "device")]
    assert (result.device_sync_count, result.device_sync_ns) == (1, 200)


@pytest.mark.parametrize("name, pageable, blocks", [
    ("cudaMemcpy", False, True), ("cudaMemcpyAsync", False, False), ("cudaMemcpyAsync", True, True),
    ("cuMemcpyDtoHAsync_v2", False, False), ("cuMemcpyDtoH_v2", True, True)])
def test_rules_blocking_copy(name, pageable, blocks):
    sql = f"SELECT {rules.blocking_copy_sql('$name', '$pageable')}"
    assert duckdb.connect().execute(sql, {"name": name, "pageable": pageable}).fetchone()[0] is blocks


def _d2h(start: int, corr: int, api: str, host: str) -> dict:
    return {"device_id": 0, "stream_id": 3, "pid": 1, "tid": 1, "correlation_id": corr, "start_ns": start,
            "end_ns": start + 10, "bytes": 4, "direction": "D2H", "src_kind": "device", "dst_kind": host,
            "api_name": api}


def test_rules_small_d2h_blocking_follows_the_readback_rules():
    """Async pinned copies block only with a sync within READBACK_FOLLOW_NS; an async pageable copy always."""
    follow = rules.READBACK_FOLLOW_NS
    copies = [(0, "pinned", follow), (1_000_000, "pinned", follow + 1), (2_000_000, "pageable", None)]
    con = make_model(
        memcpy=[_d2h(t, i, "cudaMemcpyAsync", host) for i, (t, host, _) in enumerate(copies)],
        cuda_api=[{"pid": 1, "tid": 1, "correlation_id": i, "name": "cudaMemcpyAsync", "kind": "memcpy",
                   "start_ns": t, "end_ns": t + 5} for i, (t, _, _) in enumerate(copies)]
        + [{"pid": 1, "tid": 1, "name": "cudaStreamSynchronize", "kind": "sync", "start_ns": t + 5 + gap,
            "end_ns": t + 5 + gap + 7} for t, _, gap in copies if gap is not None])
    scope = Scope(profile="t", devices=[0], start_ns=0, end_ns=3_000_000, duration_ns=3_000_000,
                  window_basis="requested")
    # the first (synced in time: call 5 ns + its sync 7 ns) and the pageable one (its call: 5 ns)
    assert memory_transfers.small_d2h(con, scope) == (3, 2, 5 + 7 + 5)


@pytest.mark.parametrize("duration, tiny", [(rules.TINY_KERNEL_NS - 1, 1), (rules.TINY_KERNEL_NS, 0)])
def test_rules_tiny_kernel_threshold_is_kernel_launch_overheads_default(duration, tiny):
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "start_ns": 0,
                               "end_ns": duration, "name": "k", "short_name": "k"}])
    result = kernel_launch_overhead.run(con, kernel_launch_overhead.Params(profile="t"))
    assert (result.threshold_ns, result.tiny_count) == (rules.TINY_KERNEL_NS, tiny)


@pytest.mark.parametrize("shares, hot", [((30, 25, 25, 20), False), ((31, 25, 24, 20), True)])
def test_rules_hotspot_share_decides_top_kernels_and_the_dominant_kernel_answer(shares, hot):
    starts = [sum(shares[:i]) for i in range(len(shares))]
    kernels = [{"device_id": 0, "stream_id": 7, "pid": 1, "start_ns": s, "end_ns": s + n, "name": f"k{i}",
                "short_name": f"k{i}"} for i, (s, n) in enumerate(zip(starts, shares, strict=True))]
    result = top_kernels.run(make_model(kernels=kernels), top_kernels.Params(profile="t"))
    assert result.rows[0].kernel_time_pct == shares[0]
    assert [r.display_name for r in result.hotspots] == (["k0"] if hot else [])

    class Found:  # answerers read top_kernels' result through Evidence.tool
        def tool(self, name, kind):
            assert (name, kind) == ("top_kernels", top_kernels.Result)
            return result
    assert answerers._dominant(Found())[0].startswith("yes" if hot else "no")


@pytest.mark.parametrize("name, waits", [("pthread_cond_wait", True), ("read", True), ("epoll_wait", True),
                                         ("ioctl", False), ("write", False), ("mmap", False)])
def test_rules_wait_calls(name, waits):
    sql = "SELECT regexp_matches($name, $waits)"
    assert duckdb.connect().execute(sql, {"name": name, "waits": rules.WAIT_CALLS}).fetchone()[0] is waits


@pytest.mark.parametrize("stake, worth, severity", [(99, False, "medium"), (100, True, "medium"),
                                                    (999, True, "medium"), (1_000, True, "high")])
def test_rules_stake_cutoffs_by_share_of_the_window(stake, worth, severity):
    assert (rules.worth_reporting(stake, 10_000), rules.severity(stake, 10_000)) == (worth, severity)


def test_rules_missing_lists_absent_data_with_its_flag():
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "pid": 1, "start_ns": 0, "end_ns": 10}])
    every = rules.missing(con)
    caps = con.execute("SELECT data, present, capture_flag FROM capabilities ORDER BY data").fetchall()
    on = {flag for _, present, flag in caps if present}  # options that recorded something: they were on
    expected = [(data, flag) for data, present, flag in caps if not present and flag not in on]
    assert [(m.data, m.capture_flag) for m in every] == expected and "nvtx" in [m.data for m in every]
    # kernels recorded, so the option that records copies was on: no copy is no missing data
    assert "memcpy" not in [m.data for m in every] and "memcpy" in [m.data for m in rules.missing(make_model())]
    assert [m.data for m in rules.missing(con, ("nvtx", "kernels", "sched"))] == ["nvtx", "sched"]
    assert rules.missing(con, ()) == []


@pytest.mark.parametrize("gpu_name, amd", [("AMD Instinct MI300X", True), ("NVIDIA H100 80GB HBM3", False)])
def test_rules_missing_on_amd_names_no_capture_that_cannot_run_there(gpu_name, amd):
    """What torch.profiler cannot record is nsys' to record, and nsys traces NVIDIA GPUs only: on an AMD GPU the
    flag says so instead of asking for it; what torch.profiler records keeps its own option."""
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "pid": 1, "start_ns": 0, "end_ns": 10}],
                     gpus=[{"device_id": 0, "name": gpu_name}])
    flags = {m.data: m.capture_flag for m in rules.missing(con, ("cpu_samples", "os_runtime", "nvtx"))}
    raw = dict(con.execute("SELECT data, capture_flag FROM capabilities").fetchall())
    assert flags["nvtx"] == raw["nvtx"]
    for data in ("cpu_samples", "os_runtime"):
        assert flags[data] == (rules.NOT_ON_AMD if amd else raw[data])
    assert rules.NOT_ON_AMD not in raw.values()  # the model's flags stay the format's: only the reading adapts


@pytest.mark.parametrize("stake_ms, window_ms, once, severity", [
    (22, 23, True, "low"),  # nsysai_mock: 22.4 ms of start-up in a 22.45 ms window of a 4-us program, paid once
    (99.999999, 100, True, "low"),  # just under ONE_RUN_LOW_NS
    (100, 1000, True, "high"),  # from ONE_RUN_LOW_NS up, by its share of the window as any cost
    (100, 1001, True, "medium"),
    (22, 23, False, "high"),  # a cost a loop repeats: by its share alone
])
def test_rules_a_one_time_cost_is_low_below_what_a_run_pays_anyway(stake_ms, window_ms, once, severity):
    assert rules.severity(round(stake_ms * 1e6), round(window_ms * 1e6), once) == severity
