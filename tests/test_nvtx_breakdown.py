"""nvtx_breakdown: CPU time per NVTX range group, GPU time of the kernels launched inside, phase split."""

from __future__ import annotations

import bisect
import random
import sqlite3
from collections import defaultdict

import pytest
from conftest import FIXTURES, dump
from modeldb import make_model

from stallhound.model.errors import InvalidRequest
from stallhound.tools import nvtx_breakdown as nv


def rng_(text: str | None, s: int, e: int, depth: int | None = 0, tid: int = 1, kind: str = "push_pop",
         domain: str | None = None) -> dict:
    return {"pid": 1, "tid": tid, "text": text, "start_ns": s, "end_ns": e, "kind": kind, "depth": depth,
            "domain": domain}


def kern(launch: int, s: int, e: int, tid: int | None = 1, device: int = 0) -> dict:
    return {"device_id": device, "stream_id": 7, "pid": 1, "tid": tid, "start_ns": s, "end_ns": e,
            "launch_start_ns": launch, "launch_end_ns": launch + 1, "short_name": "k", "name": "k"}


def run(con, **kw) -> nv.Result:
    return nv.run(con, nv.Params(profile="t", **kw))


LOOP = [rng_("iteration 0", 0, 100), rng_("forward", 0, 40, 1), rng_("backward", 40, 90, 1),
        rng_("optimizer.step", 90, 100, 1), rng_("iteration 1", 100, 200), rng_("forward", 100, 150, 1),
        rng_("backward", 150, 190, 1), rng_("dataloader", 190, 200, 1)]
LOOP_KERNELS = [kern(10, 12, 30), kern(50, 55, 80), kern(95, 96, 99), kern(120, 125, 140), kern(160, 165, 175),
                kern(15, 31, 40, tid=2)]  # the last one was launched by another thread


# --- unit ------------------------------------------------------------------------------------------
def test_nvtx_breakdown_whole_result_on_tiny_model():
    result = run(make_model(nvtx=LOOP, kernels=LOOP_KERNELS))
    assert (result.has_nvtx, result.note, result.range_count, result.truncated, result.total_rows) == (
        True, None, 8, False, 5)
    assert result.rows == [
        nv.RangeRow(name="iteration #", depth=0, count=2, cpu_ns=200, mean_cpu_ns=100.0, kernel_count=5, gpu_ns=71,
                    gpu_span_ns=137),
        nv.RangeRow(name="backward", depth=1, count=2, cpu_ns=90, mean_cpu_ns=45.0, kernel_count=2, gpu_ns=35,
                    gpu_span_ns=35),
        nv.RangeRow(name="forward", depth=1, count=2, cpu_ns=90, mean_cpu_ns=45.0, kernel_count=2, gpu_ns=33,
                    gpu_span_ns=33),
        nv.RangeRow(name="dataloader", depth=1, count=1, cpu_ns=10, mean_cpu_ns=10.0, kernel_count=0, gpu_ns=0,
                    gpu_span_ns=0),
        nv.RangeRow(name="optimizer.step", depth=1, count=1, cpu_ns=10, mean_cpu_ns=10.0, kernel_count=1, gpu_ns=3,
                    gpu_span_ns=3)]
    assert result.phase_depth == 1
    assert result.phases == [nv.PhaseRow(phase="dataload", count=1, cpu_ns=10, cpu_pct=5.0, gpu_ns=0),
                             nv.PhaseRow(phase="forward", count=2, cpu_ns=90, cpu_pct=45.0, gpu_ns=33),
                             nv.PhaseRow(phase="backward", count=2, cpu_ns=90, cpu_pct=45.0, gpu_ns=35),
                             nv.PhaseRow(phase="optimizer", count=1, cpu_ns=10, cpu_pct=5.0, gpu_ns=3)]


@pytest.mark.parametrize("kw, rows", [
    ({"by_depth": False, "limit": 2}, [("iteration #", None, 2), ("backward", None, 2)]),
    ({"merge_numbers": False, "limit": 2}, [("iteration 0", 0, 1), ("iteration 1", 0, 1)]),
    ({"max_depth": 0}, [("iteration #", 0, 2)]),
    ({"start_ns": 100, "end_ns": 200, "limit": 1}, [("iteration #", 0, 1)]),
])
def test_nvtx_breakdown_grouping_options(kw, rows):
    result = run(make_model(nvtx=LOOP, kernels=LOOP_KERNELS), **kw)
    assert [(r.name, r.depth, r.count) for r in result.rows] == rows


def test_nvtx_breakdown_domain_start_end_and_marks():
    con = make_model(nvtx=[rng_("step 3", 0, 100, None, kind="start_end", domain="train"), rng_("fwd", 0, 50),
                           {"pid": 1, "tid": 1, "text": "checkpoint", "start_ns": 60, "kind": "mark"}],
                     kernels=[kern(10, 20, 30), kern(70, 75, 80)])
    assert [(r.name, r.depth, r.kernel_count, r.gpu_ns) for r in run(con).rows] == [
        ("step #", None, 2, 15), ("fwd", 0, 1, 10)]
    assert [r.name for r in run(con, domain="train").rows] == ["step #"]


def test_nvtx_breakdown_joins_gpu_time_to_groups_without_text_or_depth():
    """CPU and GPU time are grouped apart and joined on (text, depth): a NULL text or depth still meets its GPU time."""
    con = make_model(nvtx=[rng_(None, 0, 100, None, kind="start_end"), rng_(None, 200, 260, 0),
                           rng_("idle", 300, 350, 0)],
                     kernels=[kern(10, 20, 50), kern(60, 70, 75), kern(210, 220, 230)])
    rows = {(r.name, r.depth): (r.count, r.cpu_ns, r.kernel_count, r.gpu_ns, r.gpu_span_ns) for r in run(con).rows}
    assert rows == {("", None): (1, 100, 2, 35, 55), ("", 0): (1, 60, 1, 10, 10), ("idle", 0): (1, 50, 0, 0, 0)}


def test_nvtx_breakdown_device_scope_limits_gpu_work():
    con = make_model(nvtx=[rng_("fwd", 0, 100)], kernels=[kern(10, 20, 30), kern(20, 40, 60, device=1)])
    assert [(r.kernel_count, r.gpu_ns, r.gpu_span_ns) for r in run(con).rows] == [(2, 30, 40)]
    assert [(r.kernel_count, r.gpu_ns) for r in run(con, device=1).rows] == [(1, 20)]


def test_nvtx_breakdown_attribution_matches_brute_force():
    """Ranges of every length class (fine, coarse, multi-bucket), overlapping, on two threads."""
    rnd = random.Random(3)
    lengths = (1_000, 40_000, 60_000, 3_000_000, 5_000_000, 12_000_000)
    ranges = [rng_(f"r{i}", s, s + rnd.choice(lengths) + rnd.randint(0, 999), i % 4, tid=1 + i % 2)
              for i, s in enumerate(rnd.randint(0, 40_000_000) for _ in range(300))]
    kernels = [kern(t, t + 5, t + 5 + rnd.randint(1, 900), tid=rnd.choice([1, 2]))
               for t in (rnd.randint(0, 50_000_000) for _ in range(800))]
    expected = {r["text"]: [k for k in kernels if k["tid"] == r["tid"] and r["start_ns"] <= k["launch_start_ns"]
                            < r["end_ns"]] for r in ranges}
    rows = run(make_model(nvtx=ranges, kernels=kernels), merge_numbers=False, limit=500).rows
    assert {r.name: (r.kernel_count, r.gpu_ns) for r in rows} == {
        t: (len(ks), sum(k["end_ns"] - k["start_ns"] for k in ks)) for t, ks in expected.items()}


@pytest.mark.parametrize("names, depth", [
    (["forward", "backward"], 0),
    (["load batch", "train"], None),  # one named phase is no split
    (["fwd", "loader", "misc", "other", "extra"], None),  # named phases hold under half the time
])
def test_nvtx_breakdown_phase_depth(names, depth):
    con = make_model(nvtx=[rng_(n, 100 * i, 100 * i + 50) for i, n in enumerate(names)])
    assert run(con).phase_depth == depth


def test_nvtx_breakdown_shows_the_dataload_phase_without_a_finding():
    con = make_model(nvtx=[rng_("get_batch", 0, 30), rng_("forward", 30, 60), rng_("backward", 60, 100)])
    result = run(con)
    assert [(p.phase, p.cpu_pct) for p in result.phases] == [("dataload", 30.0), ("forward", 30.0),
                                                             ("backward", 40.0)]


def test_nvtx_breakdown_without_nvtx_names_the_capture_flag():
    result = run(make_model(kernels=[kern(10, 20, 30)]))
    assert (result.has_nvtx, result.rows, result.phases) == (False, [], [])
    assert "--trace=nvtx" in result.note and "--trace=nvtx" in nv.render(result)


# --- golden on real exports ----------------------------------------------------------------------------
def raw(stem: str, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    rows = con.execute(sql).fetchall()
    con.close()
    return rows


RAW_RANGES = """
SELECT coalesce(n.text, s.value), n.start, n."end", n.globalTid
FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
WHERE n.eventType IN (59, 60, 70, 71) AND n."end" >= n.start"""
# 59/60/70/71: nsys event codes of push/pop and start/end ranges
RAW_LAUNCHES = """
SELECT min(r.start), min(r.globalTid), min(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)
GROUP BY k.rowid"""  # older exports log the runtime and the driver call under one id: the earliest launched it


@pytest.mark.parametrize("stem", ["pipit_saxpy_mpi_a100", "fuser_h200_crossentropy", "nsysai_mfu_2gpu_before"])
def test_nvtx_breakdown_matches_raw_export(open_fixture, stem):
    launches: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for start, gtid, dur in raw(stem, RAW_LAUNCHES):
        launches[gtid].append((start, dur))
    index = {g: ([s for s, _ in sorted(v)], [0] + [sum(d for _, d in sorted(v)[:i + 1]) for i in range(len(v))])
             for g, v in launches.items()}
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for text, s, e, gtid in raw(stem, RAW_RANGES):
        starts, cum = index.get(gtid, ([], [0]))
        lo, hi = bisect.bisect_left(starts, s), bisect.bisect_left(starts, e)
        for i, v in enumerate((1, e - s, hi - lo, cum[hi] - cum[lo])):
            expected[text][i] += v
    result = nv.run(open_fixture(stem).con, nv.Params(profile=stem, by_depth=False, merge_numbers=False, limit=500))
    assert result.total_rows == len(expected)
    assert {r.name: [r.count, r.cpu_ns, r.kernel_count, r.gpu_ns] for r in result.rows} == {
        t: v for t, v in sorted(expected.items(), key=lambda x: -x[1][1])[:500]}


def test_nvtx_breakdown_snapshot(open_fixture, snapshot):
    assert dump(nv.run(open_fixture("pipit_saxpy_mpi_a100").con, nv.Params(profile="p"))) == snapshot


# --- synthetic samples ------------------------------------------------------------------------------
def test_nvtx_breakdown_demo_phases_and_collective_gpu_time(demo):
    profile, truth = demo
    result = nv.run(profile.con, nv.Params(profile="demo"))
    rows = {(r.name, r.depth): r for r in result.rows}
    ranks, steps = len(truth["ranks"]), len(truth["iterations"])
    assert rows[("iteration #", 0)].count == ranks * steps
    assert rows[("ncclAllReduce", 2)].gpu_ns == sum(t["nccl_kernel_time_ns"] for t in truth["totals"]["per_device"])
    assert result.phase_depth == 1
    assert [p.phase for p in result.phases] == ["dataload", "forward", "backward", "optimizer"]
    assert all(p.count == ranks * steps for p in result.phases)


# --- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 4}, "device 4 is not in this profile"),
    ({"start_ns": 70, "end_ns": 10}, "is empty"),
    ({"start_ns": 5_000, "end_ns": 6_000}, "outside the capture"),
])
def test_nvtx_breakdown_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(nvtx=LOOP, kernels=LOOP_KERNELS), **kw)


def test_nvtx_breakdown_rejects_the_empty_export(open_fixture):
    with pytest.raises(InvalidRequest):
        nv.run(open_fixture("dynamicvit_empty_export").con, nv.Params(profile="e"))
