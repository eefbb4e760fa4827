"""iterations: boundaries from a repeated NVTX range or the kernel pattern, durations, warmup, outliers."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, dump, planted
from modeldb import make_model

from nsightful.profiles.errors import InvalidRequest
from nsightful.tools import iterations as it

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def rng_(text: str, s: int, e: int, depth: int = 0, tid: int = 1) -> dict:
    return {"pid": 1, "tid": tid, "text": text, "start_ns": s, "end_ns": e, "kind": "push_pop", "depth": depth}


def kern(s: int, e: int, name: str = "k", device: int = 0) -> dict:
    return {"device_id": device, "stream_id": 7, "start_ns": s, "end_ns": e, "short_name": name, "name": name}


def run(con, **kw) -> it.Result:
    return it.run(con, it.Params(profile="t", **kw))


STEPS = [(0, 300), (300, 400), (400, 500), (500, 600)]
RANKS = [rng_(f"iteration {i}", s + 10 * (tid - 1), e + 10 * (tid - 1), tid=tid)
         for tid in (1, 2) for i, (s, e) in enumerate(STEPS)]
BUSY = [kern(0, 100), kern(300, 355), kern(400, 455), kern(500, 555)]


# --- unit ------------------------------------------------------------------------------------------
def test_iterations_whole_result_from_nvtx():
    result = run(make_model(nvtx=RANKS, kernels=BUSY))
    assert (result.method, result.note, result.iteration_count, result.truncated, result.total_rows) == (
        "nvtx:iteration", None, 4, False, 4)
    assert result.rows == [
        it.IterationRow(index=0, start_ns=0, end_ns=310, duration_ns=310, gpu_busy_pct=35.48),
        it.IterationRow(index=1, start_ns=300, end_ns=410, duration_ns=110, gpu_busy_pct=59.09),
        it.IterationRow(index=2, start_ns=400, end_ns=510, duration_ns=110, gpu_busy_pct=59.09),
        it.IterationRow(index=3, start_ns=500, end_ns=610, duration_ns=110, gpu_busy_pct=50.0)]
    assert (result.first_ns, result.steady_median_ns, result.first_vs_steady) == (310, 110, 2.818)
    assert (result.mean_ns, result.std_ns, result.p10_ns, result.p90_ns, result.spread_ratio) == (
        160.0, 86.6, 110, 250.0, 2.273)
    assert (result.slowest_index, result.slowest_ns, result.outliers) == (0, 310, [])
    [finding] = result.findings
    assert (finding.root_cause, finding.severity, finding.time_at_stake_ns) == (
        "profiler-window-on-warmup", "medium", 200)


@pytest.mark.parametrize("ranges, kw, method", [
    # a step-like name wins over a shallower, more frequent one
    ([rng_(f"layer {i}", 100 * i, 100 * i + 90) for i in range(6)]
     + [rng_(f"step {i}", 200 * i, 200 * i + 190, depth=1) for i in range(3)], {}, "nvtx:step"),
    # otherwise the shallowest repeating name
    ([rng_("fwd", 100 * i, 100 * i + 90) for i in range(4)]
     + [rng_("op", 100 * i, 100 * i + 50, depth=1) for i in range(4)], {}, "nvtx:fwd"),
    # named explicitly (digits ignored)
    ([rng_(f"layer {i}", 100 * i, 100 * i + 90) for i in range(6)]
     + [rng_(f"step {i}", 200 * i, 200 * i + 190, depth=1) for i in range(3)], {"range_name": "layer 0"},
     "nvtx:layer"),
    # ranges covering a small part of their thread's span are per-op ranges, not steps
    ([rng_("aten::add", 100 * i, 100 * i + 5) for i in range(5)] + [rng_("main", 0, 500)], {}, None),
])
def test_iterations_nvtx_range_detection(ranges, kw, method):
    assert run(make_model(nvtx=ranges), **kw).method == method


def test_iterations_unknown_range_name_is_an_error():
    with pytest.raises(InvalidRequest, match="no NVTX push/pop range 'epoch'"):
        run(make_model(nvtx=RANKS), range_name="epoch")


def test_iterations_kernel_pattern_marks_periods_by_the_first_kernel_of_the_sequence():
    kernels = [kern(0, 50, "warmup")]
    for i in range(5):  # A B B C per step of 1000 ns
        t = 100 + 1000 * i
        kernels += [kern(t, t + 100, "A"), kern(t + 200, t + 300, "B"), kern(t + 400, t + 500, "B"),
                    kern(t + 600, t + 900, "C")]
    result = run(make_model(kernels=kernels))
    assert (result.method, result.iteration_count) == ("kernel_pattern:A", 4)
    assert [(r.start_ns, r.end_ns, r.gpu_busy_pct) for r in result.rows] == [
        (100 + 1000 * i, 1100 + 1000 * i, 60.0) for i in range(4)]
    assert run(make_model(kernels=kernels, nvtx=RANKS), method="kernel_pattern").method == "kernel_pattern:A"


def test_iterations_irregular_kernel_pattern_is_rejected():
    starts = [0, 100, 200, 5_000, 5_100, 20_000]
    result = run(make_model(kernels=[kern(s, s + 10, "A") for s in starts]))
    assert (result.method, result.iteration_count, result.rows, result.findings) == (None, 0, [], [])
    assert "no repeating NVTX range" in result.note and "No iterations" in it.render(result)


def test_iterations_flags_isolated_slow_steps_and_caps_rows():
    durations = [100, 100, 100, 350, 100, 100, 250]
    bounds = [sum(durations[:i]) for i in range(len(durations) + 1)]
    steps = [rng_(f"step {i}", s, e) for i, (s, e) in enumerate(zip(bounds, bounds[1:], strict=False))]
    result = run(make_model(nvtx=steps), limit=2)
    assert (result.iteration_count, len(result.rows), result.truncated, result.steady_median_ns) == (7, 2, True, 100)
    assert result.outliers == [it.Outlier(index=3, duration_ns=350, vs_steady=3.5),
                               it.Outlier(index=6, duration_ns=250, vs_steady=2.5)]
    assert [(f.root_cause, f.evidence["iteration"]) for f in result.findings] == [
        ("torch-compile-recompilation", 3), ("torch-compile-recompilation", 6)]


def test_iterations_two_iterations_draw_no_warmup_finding():
    con = make_model(nvtx=[rng_("step 0", 0, 500), rng_("step 1", 500, 600)])
    result = run(con, range_name="step")
    assert (result.iteration_count, result.first_vs_steady, result.findings) == (2, 5.0, [])


# --- golden on real exports ----------------------------------------------------------------------------
def raw(stem: str, sql: str, *args) -> list[tuple]:
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    rows = con.execute(sql, args).fetchall()
    con.close()
    return rows


def union_within(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    total, reach = 0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        total, reach = total + max(0, e - max(s, reach)), max(reach, e)
    return total


@pytest.mark.parametrize("stem, marker", [("pipit_saxpy_mpi_a100", "saxpy"),
                                          ("clue_t4_report4", "kernel_compute_histogram")])
def test_iterations_kernel_pattern_matches_raw_export(open_fixture, stem, marker):
    starts = [s for (s,) in raw(stem, """SELECT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                                         ON s.id = k.shortName WHERE s.value = ? ORDER BY k.start""", marker)]
    kernels = raw(stem, 'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL')
    result = it.run(open_fixture(stem).con, it.Params(profile=stem, limit=500))
    assert result.method == f"kernel_pattern:{marker}"
    assert [(r.start_ns, r.end_ns) for r in result.rows] == list(zip(starts, starts[1:], strict=False))
    assert [r.gpu_busy_pct for r in result.rows] == [
        round(100 * union_within(kernels, s, e) / (e - s), 2) for s, e in zip(starts, starts[1:], strict=False)]


def test_iterations_snapshot(open_fixture, snapshot):
    assert dump(it.run(open_fixture("clue_t4_report4").con, it.Params(profile="p", limit=5))) == snapshot


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_iterations_output_stays_small(open_fixture, stem):
    result = it.run(open_fixture(stem).con, it.Params(profile=stem))
    assert len(json.dumps(dump(result))) < 20_000
    assert it.render(result)


# --- synthetic samples ------------------------------------------------------------------------------
def test_iterations_finds_the_planted_slow_first_iteration(demo):
    profile, truth = demo
    result = it.run(profile.con, it.Params(profile="demo"))
    assert (result.method, result.iteration_count) == ("nvtx:iteration", len(truth["iterations"]))
    assert [(r.start_ns, r.end_ns) for r in result.rows] == [(i["start_ns"], i["end_ns"]) for i in truth["iterations"]]
    slow = planted(truth, "slow_first_iteration")
    assert result.first_vs_steady == pytest.approx(sum(p["ratio"] for p in slow) / len(slow), abs=0.05)
    [finding] = [f for f in result.findings if f.root_cause == "profiler-window-on-warmup"]
    assert finding.time_at_stake_ns == pytest.approx(slow[0]["duration_ns"] - slow[0]["median_other_iteration_ns"],
                                                     rel=0.02)
    assert result.outliers == []


def test_iterations_quiet_on_clean(clean):
    profile, truth = clean
    result = it.run(profile.con, it.Params(profile="clean"))
    assert result.iteration_count == len(truth["iterations"]) and result.findings == []


# --- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 2}, "device 2 is not in this profile"),
    ({"start_ns": 300, "end_ns": 300}, "is empty"),
    ({"start_ns": 9_000, "end_ns": 9_500}, "outside the capture"),
])
def test_iterations_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(nvtx=RANKS, kernels=BUSY), **kw)


def test_iterations_rejects_the_empty_export(open_fixture):
    with pytest.raises(InvalidRequest):
        it.run(open_fixture("dynamicvit_empty_export").con, it.Params(profile="e"))
