"""gpu_idle_gaps: idle stretches per device, host activity during them, periodicity, findings."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, blocked_share, planted
from modeldb import make_model

from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import gpu_idle_gaps as gg

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]
MS = 1_000_000


def k(s: int, e: int, name: str = "k", device: int = 0, stream: int = 7, tid: int | None = 7) -> dict:
    return {"device_id": device, "stream_id": stream, "pid": 1, "tid": tid, "start_ns": s, "end_ns": e,
            "short_name": name, "name": name}


def api(s: int, e: int, kind: str, name: str, tid: int = 7) -> dict:
    return {"pid": 1, "tid": tid, "name": name, "kind": kind, "start_ns": s, "end_ns": e}


def run(con, **kw) -> gg.Result:
    return run_skill(con, gg, gg.Params(profile="t", **kw))


def gap(device, start, end, before, before_end, after, after_start, activity, nvtx=(), **host) -> gg.Gap:
    figures = {f"host_{k}_ns": host.get(k, 0) for k in ("sync", "memcpy", "launch", "other")}
    return gg.Gap(device=device, stream=None, start_ns=start, end_ns=end, duration_ns=end - start,
                  kernel_before=before, kernel_before_end_ns=before_end, kernel_after=after,
                  kernel_after_start_ns=after_start, **figures, host_os_runtime_ns=host.get("os", 0),
                  host_activity=activity, nvtx=list(nvtx), periodic=False, period_ns=None)


def tiny_model():
    """Device 0: gaps 2.5-6 ms (host in poll), 7.5-8 ms (host in a copy call), 8.4-20 ms (host in a sync);
    device 1 (another thread, which traced nothing): 1-12 ms."""
    return make_model(
        kernels=[k(1 * MS, 2 * MS, "a"), k(1_500_000, 2_500_000, "b", stream=8), k(6 * MS, 7 * MS, "c"),
                 k(7 * MS, 7_500_000, "d"), k(20 * MS, 21 * MS, "e"),
                 k(0, 1 * MS, "x", device=1, tid=9), k(12 * MS, 13 * MS, "y", device=1, tid=9)],
        memcpy=[{"device_id": 0, "stream_id": 3, "start_ns": 8 * MS, "end_ns": 8_400_000, "bytes": 4,
                 "direction": "H2D"}],
        cuda_api=[api(7_900_000, 7_950_000, "memcpy", "cudaMemcpyAsync"),
                  api(9 * MS, 19 * MS, "sync", "cudaStreamSynchronize"),
                  api(19_500_000, 19_510_000, "launch", "cudaLaunchKernel")],
        os_runtime=[{"pid": 1, "tid": 7, "name": "poll", "start_ns": 3 * MS, "end_ns": 3_500_000}],
        nvtx=[{"pid": 1, "tid": 7, "text": "step", "start_ns": 0, "end_ns": 30 * MS, "kind": "push_pop", "depth": 0},
              {"pid": 1, "tid": 7, "text": "wait", "start_ns": 8_500_000, "end_ns": 19_600_000, "kind": "push_pop",
               "depth": 1},
              {"pid": 1, "tid": 7, "text": "tiny", "start_ns": 3 * MS, "end_ns": 3_100_000, "kind": "push_pop",
               "depth": 1}])


# --- unit ------------------------------------------------------------------------------------------
def test_gpu_idle_gaps_whole_result_on_tiny_model():
    result = run(tiny_model())
    assert result.scope.window_basis == "gpu_active" and (result.scope.start_ns, result.scope.end_ns) == (0, 21 * MS)
    # device 0: 0-1 ms before its first kernel, 2.5-6, 7.5-8 and 8.4-20 ms (the host in a 10 ms sync);
    # device 1 (whose thread traced nothing): 1-12 ms, then 13-21 ms after its last kernel
    assert [(g.device, g.start_ns, g.end_ns, g.cause, g.kernel_before, g.kernel_after, g.nvtx)
            for g in result.gaps] == [
        (0, 8_400_000, 20 * MS, "sync", "d", "e", ["wait", "step"]),
        (1, 1 * MS, 12 * MS, "host_untraced", "x", "y", []),
        (1, 13 * MS, 21 * MS, "host_untraced", "y", None, []),
        (0, 2_500_000, 6 * MS, "host_untraced", "b", "c", ["step"]),
        (0, 0, 1 * MS, "host_untraced", None, "a", ["step"])]
    assert [g.edge for g in result.gaps] == [False, False, True, False, True]
    assert [(d.device, d.busy_pct, d.idle_ns, d.gap_count, d.gap_time_ns, d.largest_ns) for d in result.devices] == [
        (0, 20.95, 16_600_000, 3, 16_100_000, 11_600_000), (1, 9.52, 19 * MS, 2, 19 * MS, 11 * MS)]
    assert [(c.cause, c.idle_ns, c.gaps) for c in result.devices[0].by_cause] == [
        ("sync", 11_600_000, 1), ("host_untraced", 5 * MS, 3)]
    assert (result.gap_count, result.gap_time_ns, result.truncated, result.note) == (5, 35_100_000, False, None)
    assert result.histogram == [gg.Bucket(label="1-2 ms", count=1, total_ns=1 * MS),
                                gg.Bucket(label="2-5 ms", count=1, total_ns=3_500_000),
                                gg.Bucket(label="5-10 ms", count=1, total_ns=8 * MS),
                                gg.Bucket(label="10-50 ms", count=2, total_ns=22_600_000)]
    # costliest first; the edges (device 0 before its first kernel, device 1 after its last) are no bubbles between
    # kernels: device 1 idles 11 ms between x and y, device 0 3.5 ms between b and c
    assert [(f.root_cause, f.severity, f.device, f.time_at_stake_ns) for f in result.findings] == [
        ("excessive-synchronization", "high", 0, 11_600_000), ("gpu-bubbles", "high", 1, 11 * MS),
        ("gpu-bubbles", "high", 0, 3_500_000)]
    assert result.findings_total == 3
    assert "8.400" not in gg.render(result) and "sync" in gg.render(result)


@pytest.mark.parametrize("min_gap, expected", [
    (1 * MS, [(8_400_000, 20 * MS), (1 * MS, 12 * MS), (13 * MS, 21 * MS), (2_500_000, 6 * MS), (0, 1 * MS)]),
    (400_000, [(8_400_000, 20 * MS), (1 * MS, 12 * MS), (13 * MS, 21 * MS), (2_500_000, 6 * MS), (0, 1 * MS),
               (7_500_000, 8 * MS)]),
    (11_500_000, [(8_400_000, 20 * MS)]),
])
def test_gpu_idle_gaps_min_gap_filters(min_gap, expected):
    result = run(tiny_model(), min_gap_ns=min_gap, limit=10)
    assert [(g.start_ns, g.end_ns) for g in result.gaps] == expected


def test_gpu_idle_gaps_device_and_window_restrict():
    assert {g.device for g in run(tiny_model(), device=1).gaps} == {1}
    result = run(tiny_model(), start_ns=2 * MS, end_ns=10 * MS, device=0)
    # inside 2-10 ms device 0 ran a, b, c, d and the copy, then nothing until the window's end
    assert [(g.start_ns, g.end_ns) for g in result.gaps] == [(2_500_000, 6 * MS), (8_400_000, 10 * MS)]


def test_gpu_idle_gaps_limit_truncates_but_totals_stay():
    result = run(tiny_model(), limit=1)
    assert (len(result.gaps), result.truncated, result.gap_count, result.gap_time_ns) == (1, True, 5, 35_100_000)


def periodic_model(starts_ms: list[int], length_ms: dict[int, int] | None = None):
    """One kernel per start, 8 ms long unless `length_ms` says otherwise: 2 ms gaps between 10 ms slots."""
    lengths = length_ms or {}
    return make_model(kernels=[k(s * MS, (s + lengths.get(s, 8)) * MS, tid=None) for s in starts_ms])


def test_gpu_idle_gaps_periodic_groups():
    result = run(periodic_model([0, 10, 20, 30, 40, 53]))
    assert [(g.start_ns // MS, g.duration_ns // MS, g.periodic) for g in result.gaps] == [
        (48, 5, False), (8, 2, True), (18, 2, True), (28, 2, True), (38, 2, True)]
    assert result.periodic_groups == [gg.PeriodicGroup(
        device=0, count=4, mean_duration_ns=2 * MS, period_ns=10 * MS, total_ns=8 * MS, first_start_ns=8 * MS,
        cause="host_untraced")]
    assert result.note and "launch" in result.note  # no launch call traced: the host cannot be seen


def test_gpu_idle_gaps_periodic_groups_capped_costliest_first():
    # the same 2 ms pattern on eight devices, device d's gaps d * 0.1 ms longer
    kernels = [k(s * MS, (s + 8) * MS - d * MS // 10, device=d, tid=None) for d in range(8) for s in (0, 10, 20, 30)]
    result = run(make_model(kernels=kernels))
    assert result.periodic_group_count == 8
    assert gg.PERIODIC_ROWS == 5 and [g.device for g in result.periodic_groups] == [7, 6, 5, 4, 3]
    assert "3 more periodic groups" in gg.render(result)


@pytest.mark.parametrize("starts_ms, length_ms, periodic", [
    ([0, 10, 20], {}, False),  # two 2 ms gaps are not a pattern
    ([0, 10, 20, 30], {}, True),  # three at the same length and spacing
    ([0, 10, 20, 30, 60], {30: 28}, False),  # 2 ms gaps at 8, 18, 28 and 58 ms: the last 30 ms apart
    ([0, 10, 20, 30, 40, 50, 60, 70, 80, 90], {80: 13}, True),  # one odd interval among eight steady ones
])
def test_gpu_idle_gaps_periodic_needs_a_steady_interval(starts_ms, length_ms, periodic):
    gaps = [g for g in run(periodic_model(starts_ms, length_ms)).gaps if g.duration_ns == 2 * MS]
    assert gaps and all(g.periodic == periodic for g in gaps)


# --- golden: gaps from an independent sweep over the raw export -----------------------------------------
def raw_gaps(stem: str, min_gap: int = 1_000_000) -> dict[int, list[tuple[int, int]]]:
    """Idle stretches per device over the GPU-active window (first to last operation of any device)."""
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ops = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
           if t in tables]
    rows = con.execute(" UNION ALL ".join(f'SELECT deviceId, start, "end" FROM {t} WHERE "end" > start'
                                          for t in ops)).fetchall()
    lo, hi = min(r[1] for r in rows), max(r[2] for r in rows)
    out: dict[int, list[tuple[int, int]]] = {}
    for device in sorted({r[0] for r in rows}):
        reach, found = lo, []
        for _, s, e in sorted(r for r in rows if r[0] == device):
            if s - reach >= min_gap:
                found.append((reach, s))
            reach = max(reach, e)
        out[device] = found + ([(reach, hi)] if hi - reach >= min_gap else [])
    return out


@pytest.mark.parametrize("stem", ["clue_t4_report4", "fuser_h200_crossentropy", "pipit_saxpy_mpi_a100",
                                  "nsysai_mfu_2gpu_before", "nsysai_mock"])
def test_gpu_idle_gaps_match_an_independent_sweep_of_the_raw_export(open_fixture, stem):
    result = run(open_fixture(stem).con, limit=500)
    expected = raw_gaps(stem)
    assert {(g.device, g.start_ns, g.end_ns) for g in result.gaps} == {
        (d, s, e) for d, found in expected.items() for s, e in found}
    assert {d.device: (d.gap_count, d.gap_time_ns) for d in result.devices} == {
        d: (len(found), sum(e - s for s, e in found)) for d, found in expected.items()}


# --- planted problems on the synthetic sample ---------------------------------------------------------
def test_gpu_idle_gaps_finds_every_planted_gap_exactly(demo):
    profile, truth = demo
    result = run(profile.con, limit=500)
    interior = {(g.device, g.start_ns, g.end_ns) for g in result.gaps if not g.edge}
    assert interior == {(g["device"], g["start_ns"], g["end_ns"]) for g in truth["gpu_gaps"]}


@pytest.mark.parametrize("host, cause", [("nothing traced", "host_untraced"), ("os_runtime:poll", "input_wait")])
def test_gpu_idle_gaps_planted_idle_gaps_with_their_cause(demo, host, cause):
    profile, truth = demo
    [plant] = [p for p in planted(truth, "idle_gap") if p["host_activity"] == host]
    result = run(profile.con, device=plant["device"])
    [found] = [g for g in result.gaps if g.start_ns == plant["start_ns"]]
    assert (found.duration_ns, found.cause, found.nvtx[0], found.periodic) == (
        plant["duration_ns"], cause, plant["phase"], False)


def test_gpu_idle_gaps_gc_pauses_are_periodic(demo):
    profile, truth = demo
    result = run(profile.con, limit=500)
    by_place = {(g.device, g.start_ns, g.end_ns): g for g in result.gaps}
    pauses = [p for p in planted(truth, "gc_pause") if p["gpu_idle_start_ns"] is not None]
    assert len(pauses) >= 3 * len(truth["devices"])
    # the demo pauses right after its pageable input copy: the device runs dry inside that cudaMemcpyAsync, which
    # keeps its share of the gap (analysis/attribution.py); the rest, the host's late resume, is the pause
    tids = {r["device"]: r["global_tid"] for r in truth["ranks"]}
    copy_ns = {}
    for pause in pauses:
        found = by_place[(pause["device"], pause["gpu_idle_start_ns"], pause["gpu_idle_end_ns"])]
        _, copy_ns[found.start_ns] = blocked_share(profile.path, found.device, tids[found.device], "cudaMemcpy%",
                                                   found.start_ns, found.end_ns, result.scope.start_ns)
        host = found.late_cause if found.late_ns else found.cause
        assert found.periodic and host == "host_untraced"
        assert found.duration_ns - found.late_ns == copy_ns[found.start_ns] > 0
    gc = {d: f.time_at_stake_ns for d in truth["devices"]
          for f in run(profile.con, device=d).findings if f.root_cause == "gc-pauses"}
    assert gc == {d: sum(p["gpu_idle_end_ns"] - p["gpu_idle_start_ns"] - copy_ns[p["gpu_idle_start_ns"]]
                         for p in pauses if p["device"] == d) for d in truth["devices"]}


def test_gpu_idle_gaps_quiet_on_clean(clean):
    profile, _ = clean
    result = run(profile.con)
    assert (result.gap_count, result.gaps, result.findings) == (0, [], [])


# --- errors and bounds ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 9}, "device 9 is not in this profile"),
    ({"start_ns": 5 * MS, "end_ns": 5 * MS}, "is empty"),
    ({"start_ns": 100 * MS, "end_ns": 200 * MS}, "outside the capture"),
])
def test_gpu_idle_gaps_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(tiny_model(), **kw)


def test_gpu_idle_gaps_rejects_a_too_small_min_gap():
    with pytest.raises(ValueError):
        gg.Params(profile="t", min_gap_ns=10)


def test_gpu_idle_gaps_empty_export_has_no_window(open_fixture):
    with pytest.raises(InvalidRequest):
        run(open_fixture("dynamicvit_empty_export").con)


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_gpu_idle_gaps_default_result_is_small(open_fixture, stem):
    result = run(open_fixture(stem).con)
    assert len(result.model_dump_json()) < 20_000 and gg.render(result)
