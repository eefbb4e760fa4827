"""sync_analysis: blocking calls per API and thread, host time blocked, GPU idle while the host waited."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, planted
from modeldb import make_model

from stallhound.analysis import attribution
from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import sync_analysis as sa

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def k(s: int, e: int, device: int, tid: int) -> dict:
    return {"device_id": device, "stream_id": 7, "pid": 1, "tid": tid, "start_ns": s, "end_ns": e,
            "short_name": "k", "name": "k"}


def call(s: int, e: int, name: str, tid: int, pid: int = 1) -> dict:
    kind = "memcpy" if "Memcpy" in name else "sync"
    return {"pid": pid, "tid": tid, "name": name, "kind": kind, "start_ns": s, "end_ns": e}


def tiny_model():
    """Thread 1 launches on devices 0 and 1, thread 2 on device 0, thread 3 nothing (its process: 0 and 1);
    process 2 put no work on any device."""
    return make_model(
        kernels=[k(0, 100, 0, 1), k(300, 400, 0, 2), k(150, 250, 1, 1), k(600, 700, 1, 1)],
        memcpy=[{"device_id": 0, "stream_id": 3, "pid": 1, "start_ns": 500, "end_ns": 520, "bytes": 8,
                 "direction": "H2D"}],
        cuda_api=[call(50, 350, "cudaDeviceSynchronize", 1), call(450, 650, "cudaStreamSynchronize", 1),
                  call(100, 300, "cudaEventSynchronize", 2), call(380, 420, "cudaMemcpy", 2),
                  call(420, 430, "cudaMemcpyAsync", 2), call(600, 700, "cuCtxSynchronize", 3),
                  call(0, 50, "cudaDeviceSynchronize", 5, pid=2)],
        threads=[{"pid": 1, "tid": 1, "name": "main"}, {"pid": 1, "tid": 2, "name": "worker"}])


def run(con, **kw) -> sa.Result:
    return run_skill(con, sa, sa.Params(profile="t", **kw))


def api(name, kind, blocked, idle) -> sa.ApiRow:
    return sa.ApiRow(api_name=name, scope_kind=kind, count=1, blocked_ns=blocked, mean_ns=float(blocked),
                     max_ns=blocked, gpu_idle_ns=idle, gpu_idle_pct=round(100 * idle / blocked, 2))


# --- unit ------------------------------------------------------------------------------------------
def test_sync_analysis_whole_result_on_tiny_model():
    result = run(tiny_model())
    assert (result.scope.start_ns, result.scope.end_ns) == (0, 700)
    # process 2 recorded no GPU work: with every device in scope its call counts, with no device and no GPU idle
    assert (result.call_count, result.blocked_ns, result.gpu_idle_ns, result.no_device_calls) == (5, 850, 430, 1)
    assert (result.device_sync_count, result.device_sync_ns) == (3, 450)
    assert result.apis == [  # copies are not synchronization calls: cudaMemcpy is left out
        # devices 0+1 busy 50-100, 150-250, 300-350 in the first (300 ns); process 2's (50 ns) on no known device
        sa.ApiRow(api_name="cudaDeviceSynchronize", scope_kind="device", count=2, blocked_ns=350, mean_ns=175.0,
                  max_ns=300, gpu_idle_ns=100, gpu_idle_pct=28.57),
        api("cudaEventSynchronize", "event", 200, 200),  # device 0 ran nothing in 100-300
        api("cudaStreamSynchronize", "stream", 200, 130),  # copy 500-520 on 0, kernel 600-650 on 1
        api("cuCtxSynchronize", "device", 100, 0)]  # thread 3 counts with its process's devices
    assert result.threads == [
        sa.ThreadRow(pid=1, tid=1, thread_name="main", devices=[0, 1], count=2, blocked_ns=500,
                     blocked_window_pct=71.43, device_syncs=1, steady_device_syncs=1, device_sync_ns=300,
                     gpu_idle_ns=230),
        sa.ThreadRow(pid=1, tid=2, thread_name="worker", devices=[0], count=1, blocked_ns=200,
                     blocked_window_pct=28.57, device_syncs=0, steady_device_syncs=0, device_sync_ns=0,
                     gpu_idle_ns=200),
        sa.ThreadRow(pid=1, tid=3, thread_name=None, devices=[0, 1], count=1, blocked_ns=100,
                     blocked_window_pct=14.29, device_syncs=1, steady_device_syncs=0,  # ends with the last kernel
                     device_sync_ns=100, gpu_idle_ns=0),
        sa.ThreadRow(pid=2, tid=5, thread_name=None, devices=[], count=1, blocked_ns=50, blocked_window_pct=7.14,
                     device_syncs=1, steady_device_syncs=0, device_sync_ns=50, gpu_idle_ns=0)]
    # idle attribution: device 0 drains inside the event sync (100-300), the synchronous copy (400-420, and 20 ns of
    # its 80 ns turnaround: the 380-400 of the kernel it waited for) and the stream sync (520-650, and 20 ns of its
    # 50 ns turnaround: the copy it waited for); device 1 inside the device sync (250-350) and its turnaround to the
    # stream sync (350-450: of the 100 ns of device 1's work it waited for)
    assert [(f.root_cause, f.severity, f.device, f.time_at_stake_ns, f.tags) for f in result.findings] == [
        ("excessive-synchronization", "high", 0, 390, ["event-sync"]),  # 200 ns of it in the event sync
        ("excessive-synchronization", "high", 1, 200, ["device-sync"])]  # 100 in it, 100 of its 100 ns turnaround
    assert not result.truncated and "cudaEventSynchronize" in sa.render(result)


def test_sync_analysis_device_scope_keeps_threads_of_that_device():
    result = run(tiny_model(), device=1)  # thread 2 launched only on device 0, process 2 on no known device: out
    assert [(t.tid, t.devices, t.gpu_idle_ns) for t in result.threads] == [(1, [1], 300 - 100 + 200 - 50), (3, [1], 0)]


def test_sync_analysis_counts_device_syncs_of_a_capture_of_api_calls_alone():
    """No kernel, copy or memset recorded (WSL2, or a failed activity trace): the driver's cuCtxSynchronize, the
    runtime's cudaDeviceSynchronize and the deprecated cudaThreadSynchronize are all device-wide syncs."""
    con = make_model(cuda_api=[call(0, 10, "cuCtxSynchronize", 1), call(20, 30, "cuCtxSynchronize", 1),
                               call(40, 45, "cudaDeviceSynchronize", 1), call(50, 60, "cudaThreadSynchronize", 1),
                               call(70, 90, "cuEventSynchronize", 1)])
    result = run(con)
    assert (result.call_count, result.device_sync_count, result.device_sync_ns, result.no_device_calls) == (
        5, 4, 35, 5)
    assert "GPU idle inside them is unknown" in sa.render(result)


def test_sync_analysis_window_clips_calls():
    result = run(tiny_model(), start_ns=200, end_ns=300)
    # device sync 200-300 (device 1 busy to 250), event sync 200-300 (device 0 idle)
    assert [(a.api_name, a.blocked_ns, a.gpu_idle_ns) for a in result.apis] == [
        ("cudaDeviceSynchronize", 100, 50), ("cudaEventSynchronize", 100, 100)]


def test_sync_analysis_limit_truncates():
    result = run(tiny_model(), limit=1)
    assert ([a.api_name for a in result.apis], len(result.threads), result.truncated) == (
        ["cudaDeviceSynchronize"], 1, True)


@pytest.mark.parametrize("kernels, expected", [
    ([(0, 10_000)], []),  # the device stays busy through every sync: nothing drained, nothing to recover
    # the 550-700 sync drained it: its 100 ns after the device ran dry, and of the 800 ns to the next sync only the
    # 50 ns of work it waited for (the rest, the host's, is untraced)
    ([(0, 600), (2_000, 10_000)], [("excessive-synchronization", 0, 150)]),
])
def test_sync_analysis_findings_are_the_idle_the_syncs_cause(kernels, expected):
    calls = [call(s, e, "cudaDeviceSynchronize", 1) for s, e in ((550, 700), (1500, 1510), (2500, 2510))]
    con = make_model(kernels=[k(s, e, 0, 1) for s, e in kernels], cuda_api=calls)
    assert [(f.root_cause, f.device, f.time_at_stake_ns) for f in run(con).findings] == expected


# --- golden: independent SQL on the raw export ------------------------------------------------------------
RAW_SQL = """
SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
WHERE s.value LIKE 'cudaStreamSynchronize%'
"""


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "clue_t4_report4", "nsysai_mock"])
def test_sync_analysis_stream_sync_count_matches_raw_sql(open_fixture, stem):
    raw = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    [expected] = raw.execute(RAW_SQL).fetchone()
    result = run(open_fixture(stem).con)
    assert expected > 0
    assert [a.count for a in result.apis if a.api_name == "cudaStreamSynchronize"] == [expected]


# --- planted problems on the synthetic sample ---------------------------------------------------------
def test_sync_analysis_finds_planted_device_syncs(demo):
    profile, truth = demo
    plants = planted(truth, "device_sync")
    assert len(plants) == len(truth["devices"])
    for plant in plants:
        result = run(profile.con, device=plant["device"])
        [thread] = result.threads
        assert (thread.devices, thread.device_syncs, thread.device_sync_ns) == (
            [plant["device"]], plant["count"], plant["blocked_ns"])
        assert thread.steady_device_syncs >= plant["count"] - 1  # the last may close the run
        # the demo syncs after the optimizer's tiny kernels, launched about as fast as they run: each waits some 25 us
        # of queued work, and the host's 0.4-0.8 ms after it would idle the device with the sync gone too. So the
        # syncs claim their own time (the planted blocked_ns) and no more: under 1% of the window, no finding
        [idle] = attribution.attribute(profile.con, result.scope).devices.values()
        assert (idle.causes["sync"].ns, idle.causes["sync"].calls) == (plant["blocked_ns"], plant["count"])
        assert "excessive-synchronization" not in {f.root_cause for f in result.findings}
        assert [f.device for f in result.findings if f.root_cause == "blocking-d2h-sync"] == [plant["device"]]


def test_sync_analysis_quiet_on_clean(clean):
    profile, _ = clean
    result = run(profile.con)
    assert (result.call_count, result.findings) == (0, [])


# --- errors and bounds ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 9}, "device 9 is not in this profile"),
    ({"start_ns": 300, "end_ns": 300}, "is empty"),
    ({"start_ns": 10_000, "end_ns": 20_000}, "outside the capture"),
])
def test_sync_analysis_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(tiny_model(), **kw)


def test_sync_analysis_empty_export_has_no_window(open_fixture):
    with pytest.raises(InvalidRequest):
        run(open_fixture("dynamicvit_empty_export").con)


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_sync_analysis_default_result_is_small(open_fixture, stem):
    result = run(open_fixture(stem).con)
    assert len(result.model_dump_json()) < 20_000 and sa.render(result)


# --- clue_t4_report4: the syncs' count and time, checked against the raw export ------------------------------------
CLUE_WORK_SQL = """SELECT k.start, k."end", NULL, NULL, r."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId)
UNION ALL SELECT m.start, m."end", NULL, NULL, r."end" FROM CUPTI_ACTIVITY_KIND_MEMSET m
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId)
UNION ALL SELECT m.start, m."end", o.name, c.name, NULL FROM CUPTI_ACTIVITY_KIND_MEMCPY m
  JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind JOIN ENUM_CUDA_UNIF_MEM_MIGRATION c ON c.id = m.migrationCause"""
CLUE_SYNCS_SQL = """SELECT r.start, r."end" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
WHERE s.value LIKE 'cudaStreamSynchronize%' ORDER BY 1"""


def _clue_sync_share(lo: int, hi: int) -> tuple[int, int, int, int]:
    """From the raw export (one process), over [lo, hi): (the idle the cudaStreamSynchronize calls explain, the calls
    it lies in, the idle inside those calls, the part of that before a migration the driver issued). Each idle gap
    that begins in a call is the call's from its start to the call's return plus SYNC_RESUME_MAX_NS (or to its end),
    unless what ends it was queued before it began: a kernel or memset whose launch call had returned, or, with the
    gap inside the call, a migration the host did not start (every migration here but a page fault to the host, or
    the driver's speculation around one): then the device waited on the driver."""
    from stallhound.analysis.attribution import SYNC_RESUME_MAX_NS
    raw = sqlite3.connect(f"file:{FIXTURES / 'clue_t4_report4.sqlite'}?mode=ro", uri=True)
    work = sorted((max(s, lo), min(e, hi), o, c, le) for s, e, o, c, le in raw.execute(CLUE_WORK_SQL)
                  if e > lo and s < hi)
    driver = {s for s, _, o, c, _ in work if o and not (o.endswith("UVM_DTOH") and c.endswith(("COHERENCE",
                                                                                                  "_CAUSE_PREFETCH")))}
    launched = {}  # an operation's start -> when the first launch call of the operations starting then returned
    for s, _, _, _, le in work:
        launched[s] = min(launched.get(s, le or hi), le or hi)
    gaps, reach = [], lo
    for s, e, *_ in [*work, (hi, hi, None, None, None)]:
        if s > reach:
            gaps.append((reach, s))
        reach = max(reach, e)
    share, calls, inside, waited = 0, set(), 0, 0
    for g0, g1 in gaps:
        for c0, c1 in raw.execute(CLUE_SYNCS_SQL):
            inside += max(0, min(g1, c1) - max(g0, c0))
            if not c0 <= g0 < c1 or launched.get(g1, hi) <= g0:
                continue
            if g1 in driver and g1 <= c1:
                waited += g1 - g0
            else:
                share, calls = share + min(g1, c1 + SYNC_RESUME_MAX_NS) - g0, calls | {c0}
    return share, len(calls), inside, waited


def test_sync_analysis_clue_counts_the_calls_and_claims_the_idle_they_explain(open_fixture):
    """CLUE syncs once per iteration (20 calls). The device idles 10.76 ms inside those calls, 10.1 ms of it waiting
    on the driver between the prefetches back to the host: not the syncs'. About 1 us after each returns the thread
    calls fwrite() and prints for ~4.7 ms: its own work, so the syncs keep only the drain inside them and that 1 us
    (0.311 ms in all, tests/test_gap_split.py), not worth a finding; before, a 1 ms turnaround each (18.35 ms)."""
    con = open_fixture("clue_t4_report4").con
    assert not [f for f in run(con).findings if f.root_cause == "excessive-synchronization"]
    s = run(con).scope
    _, calls, inside, waited = _clue_sync_share(s.start_ns, s.end_ns)
    assert (calls, round(inside / 1e6, 2), round(waited / 1e6, 1)) == (20, 10.76, 10.1)
