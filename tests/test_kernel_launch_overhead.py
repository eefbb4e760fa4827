"""kernel_launch_overhead: tiny kernels, launch API time vs GPU time, queue delay, graph launches."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, planted
from modeldb import make_model

from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import kernel_launch_overhead as klo

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def k(start: int, duration: int, name: str, corr: int, launch: tuple[int, int] | None, device: int = 0,
      api: str = "cudaLaunchKernel", node: int | None = None) -> dict:
    row = {"device_id": device, "stream_id": 7, "pid": 1, "correlation_id": corr, "start_ns": start,
           "end_ns": start + duration, "short_name": name, "name": name, "graph_node_id": node}
    if launch:
        row.update(tid=1, launch_api=api, launch_start_ns=launch[0], launch_end_ns=launch[1])
    return row


def tiny_model():
    return make_model(
        kernels=[k(10_000, 5_000, "tiny_a", 1, (0, 8_000)), k(30_000, 3_000, "tiny_a", 2, (20_000, 26_000)),
                 k(100_000, 50_000, "big", 3, (40_000, 45_000)), k(160_000, 2_000, "tiny_b", 4, None),
                 k(220_000, 4_000, "tiny_b", 5, (200_000, 210_000), api="cudaGraphLaunch", node=11),
                 k(230_000, 6_000, "g", 5, (200_000, 210_000), api="cudaGraphLaunch", node=12),
                 k(5_000, 20_000, "big", 7, (0, 5_000), device=1)],
        cuda_api=[{"pid": 1, "tid": 1, "correlation_id": 5, "name": "cudaGraphLaunch", "kind": "graph",
                   "start_ns": 200_000, "end_ns": 210_000}])


def run(con, **kw) -> klo.Result:
    return run_skill(con, klo, klo.Params(profile="t", **kw))


# --- unit ------------------------------------------------------------------------------------------
def test_kernel_launch_overhead_whole_result_on_tiny_model():
    result = run(tiny_model())
    assert (result.kernel_count, result.tiny_count, result.tiny_kernel_pct, result.graph_launch_calls) == (
        7, 5, 71.43, 1)
    assert result.devices == [
        klo.DeviceLaunch(device=0, kernel_count=6, kernel_time_ns=70_000, tiny_count=5, tiny_time_ns=20_000,
                         tiny_kernel_pct=83.33, tiny_time_pct=28.57, launch_traced_kernels=5, launch_calls=4,
                         launch_api_ns=29_000, launched_kernel_ns=68_000, launch_to_kernel_ratio=0.426,
                         tiny_launch_api_ns=24_000, queue_delay_median_ns=4_000.0, queue_delay_p90_ns=44_800.0,
                         queue_delay_max_ns=55_000, graph_kernels=2),
        klo.DeviceLaunch(device=1, kernel_count=1, kernel_time_ns=20_000, tiny_count=0, tiny_time_ns=0,
                         tiny_kernel_pct=0.0, tiny_time_pct=0.0, launch_traced_kernels=1, launch_calls=1,
                         launch_api_ns=5_000, launched_kernel_ns=20_000, launch_to_kernel_ratio=0.25,
                         tiny_launch_api_ns=0, queue_delay_median_ns=0.0, queue_delay_p90_ns=0.0,
                         queue_delay_max_ns=0, graph_kernels=0)]
    assert result.top_tiny == [
        klo.TinyKernel(name="tiny_a", count=2, total_ns=8_000, mean_ns=4_000.0, max_ns=5_000),
        klo.TinyKernel(name="tiny_b", count=2, total_ns=6_000, mean_ns=3_000.0, max_ns=4_000),
        klo.TinyKernel(name="g", count=1, total_ns=6_000, mean_ns=6_000.0, max_ns=6_000)]
    assert (result.truncated, result.total_rows, result.findings) == (False, 3, [])
    assert "tiny_a" in klo.render(result)


@pytest.mark.parametrize("api, graph", [("cudaGraphLaunch_v10000", True), ("cuGraphExecLaunch", True),
                                        ("cuGraphLaunch", True), ("cudaLaunchKernel", False),
                                        ("cudaGraphExecUpdate", False), (None, False)])
def test_kernel_launch_overhead_graph_kernels_by_launch_api(api, graph):
    """Without graph ids a kernel is a graph kernel when its launch API contains GraphLaunch or GraphExecLaunch:
    it then counts in graph_kernels and leaves the queue delay (only the 40 us-queued kernel has the API)."""
    kernels = [k(50_000, 1_000, "a", 1, (0, 10_000), api=api or "cudaLaunchKernel"),
               k(60_000, 1_000, "b", 2, (55_000, 58_000))]
    if api is None:
        kernels[0].pop("launch_api")
    device = run(make_model(kernels=kernels)).devices[0]
    assert (device.graph_kernels, device.queue_delay_max_ns) == ((1, 2_000) if graph else (0, 40_000))


@pytest.mark.parametrize("threshold, tiny", [(1, 0), (3_001, 2), (10_000, 5), (50_001, 7)])
def test_kernel_launch_overhead_threshold(threshold, tiny):
    assert run(tiny_model(), threshold_ns=threshold).tiny_count == tiny


def test_kernel_launch_overhead_limit_and_window():
    capped = run(tiny_model(), limit=1)
    assert ([t.name for t in capped.top_tiny], capped.truncated, capped.total_rows) == (["tiny_a"], True, 3)
    early = run(tiny_model(), start_ns=0, end_ns=50_000)  # kernels starting before 50 us: both tiny_a and dev 1
    assert [(d.device, d.kernel_count) for d in early.devices] == [(0, 2), (1, 1)]
    assert [d.device for d in run(tiny_model(), device=1).devices] == [1]


def tiny_stream(count: int, queued: bool) -> list[dict]:
    """`count` 3 us kernels 8 us apart, each launched after (queued=False) or long before (True) the previous ends."""
    rows = []
    for n in range(count):
        start = 100_000 + n * 8_000
        launch = (start - 60_000, start - 50_000) if queued else (start - 4_000, start - 1_000)
        rows.append(k(start, 3_000, "tiny", n + 1, launch))
    return rows


@pytest.mark.parametrize("count, queued, expected", [
    (200, False, [("small-kernel-overhead", "high", 199 * 5_000)]),  # the device waits 5 us for each launch
    (200, True, []),  # the same kernels queued ahead: the device never waits for the host
    (50, False, []),  # a handful of launches is not the pattern (TINY_MIN_GAPS)
])
def test_kernel_launch_overhead_findings_are_the_idle_launching_costs(count, queued, expected):
    result = run(make_model(kernels=tiny_stream(count, queued)))
    assert [(f.root_cause, f.severity, f.time_at_stake_ns) for f in result.findings] == expected


# --- golden: independent SQL on the raw export ------------------------------------------------------------
RAW_SQL = """
SELECT deviceId, count(*), sum("end" - start), sum(CASE WHEN "end" - start < 10000 THEN 1 ELSE 0 END),
       sum(CASE WHEN "end" - start < 10000 THEN "end" - start ELSE 0 END)
FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId ORDER BY deviceId
"""
RAW_LAUNCH_SQL = """
SELECT k.deviceId, count(*), sum(r."end" - r.start) FROM (
  SELECT DISTINCT deviceId, globalPid / 16777216 % 16777216 AS pid, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL) k
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND r.globalTid / 16777216 % 16777216 = k.pid
JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE 'cu%Launch%'
GROUP BY k.deviceId ORDER BY k.deviceId
"""


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "fuser_h200_crossentropy", "clue_t4_report4"])
def test_kernel_launch_overhead_matches_raw_sql(open_fixture, stem):
    raw = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    result = run(open_fixture(stem).con)
    assert [(d.device, d.kernel_count, d.kernel_time_ns, d.tiny_count, d.tiny_time_ns) for d in result.devices] == [
        tuple(r) for r in raw.execute(RAW_SQL)]
    assert [(d.device, d.launch_calls, d.launch_api_ns) for d in result.devices] == [
        tuple(r) for r in raw.execute(RAW_LAUNCH_SQL)]


# --- planted problems on the synthetic sample ---------------------------------------------------------
def test_kernel_launch_overhead_finds_planted_tiny_kernels(demo):
    profile, truth = demo
    plants = planted(truth, "tiny_kernels")
    assert len(plants) == len(truth["devices"])
    result = run(profile.con)
    by_device = {d.device: d for d in result.devices}
    for plant in plants:
        found = by_device[plant["device"]]
        assert (found.tiny_count, found.tiny_time_ns) == (plant["count"], plant["kernel_time_ns"])
    flagged = {f.device for f in result.findings if f.root_cause == "small-kernel-overhead"}
    assert flagged == {p["device"] for p in plants}


def test_kernel_launch_overhead_quiet_on_clean(clean):
    profile, _ = clean
    result = run(profile.con)
    assert result.tiny_count == 0 and result.findings == []


# --- errors and bounds ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 9}, "device 9 is not in this profile"),
    ({"start_ns": 50_000, "end_ns": 10_000}, "is empty"),
    ({"start_ns": 10**9, "end_ns": 2 * 10**9}, "outside the capture"),
])
def test_kernel_launch_overhead_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(tiny_model(), **kw)


def test_kernel_launch_overhead_empty_export_has_no_window(open_fixture):
    with pytest.raises(InvalidRequest):
        run(open_fixture("dynamicvit_empty_export").con)


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_kernel_launch_overhead_default_result_is_small(open_fixture, stem):
    result = run(open_fixture(stem).con)
    assert len(result.model_dump_json()) < 20_000 and klo.render(result)
