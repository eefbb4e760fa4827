"""nccl_breakdown: NCCL time per collective/stream/device, overlap with compute, shared streams, rank balance."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, dump, planted
from modeldb import make_model, union_ns

from nsightful.profiles.errors import InvalidRequest
from nsightful.tools import nccl_breakdown as nb

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def comp(s: int, e: int, device: int = 0, stream: int = 7) -> dict:
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "short_name": "gemm",
            "name": "gemm", "category": "compute"}


def nccl(s: int, e: int, device: int = 0, stream: int = 21, coll: str = "AllReduce") -> dict:
    name = f"ncclDevKernel_{coll}_Sum_f32_RING_LL"
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "short_name": name, "name": name,
            "category": "nccl", "nccl_collective": coll}


def run(con, **kw) -> nb.Result:
    return nb.run(con, nb.Params(profile="t", **kw))


def overlap_ns(probe: tuple[int, int], others: list[tuple[int, int]]) -> int:
    s, e = probe
    return union_ns([(max(a, s), min(b, e)) for a, b in others if b > s and a < e])


# --- unit ------------------------------------------------------------------------------------------
def test_nccl_breakdown_whole_result_on_tiny_model():
    con = make_model(kernels=[
        comp(0, 10), comp(5, 15), comp(40, 50), nccl(8, 30), nccl(45, 60, stream=7, coll="AllGather"),
        comp(0, 50, device=1), nccl(10, 20, device=1)])
    result = run(con)
    assert result.scope.model_dump() == {"profile": "t", "devices": [0, 1], "start_ns": 0, "end_ns": 60,
                                         "duration_ns": 60, "window_basis": "gpu_active"}
    assert (result.has_nccl, result.note, result.nccl_count, result.nccl_ns, result.window_pct) == (
        True, None, 3, 47, 39.17)
    assert (result.overlapped_ns, result.overlapped_pct, result.exposed_ns) == (22, 46.81, 25)
    assert result.rows == [
        nb.CollectiveRow(collective="AllReduce", stream=21, devices=2, count=2, total_ns=32, mean_ns=16.0,
                         window_pct=26.67, overlapped_ns=17, overlapped_pct=53.12, exposed_ns=15),
        nb.CollectiveRow(collective="AllGather", stream=7, devices=1, count=1, total_ns=15, mean_ns=15.0,
                         window_pct=12.5, overlapped_ns=5, overlapped_pct=33.33, exposed_ns=10)]
    assert (result.truncated, result.total_rows) == (False, 2)
    assert result.devices == [
        nb.DeviceNccl(device=0, count=2, nccl_ns=37, mean_ns=18.5, window_pct=61.67, overlapped_ns=12, exposed_ns=25),
        nb.DeviceNccl(device=1, count=1, nccl_ns=10, mean_ns=10.0, window_pct=16.67, overlapped_ns=10, exposed_ns=0)]
    assert (result.spread_ns, result.spread_pct, result.least_nccl_device) == (27, 114.89, 1)
    assert result.nccl_on_compute_stream == [nb.SharedStream(device=0, stream=7, nccl_kernels=1, compute_kernels=3)]
    # the late rank (1) overlaps fully: no serialization; its straggling explains the high share (no imbalance)
    assert [(f.root_cause, f.device) for f in result.findings] == [("nccl-on-compute-stream", 0),
                                                                   ("nccl-straggler", 1)]


@pytest.mark.parametrize("probe, others, expected", [
    ((10, 20), [(0, 100)], 10),  # inside one long kernel
    ((10, 20), [(0, 10), (20, 30)], 0),  # touching on both sides
    ((10, 50), [(12, 20), (15, 25), (30, 35)], 18),  # overlapping compute kernels count once
    ((1_000_000, 9_000_000), [(0, 2_500_000), (8_500_000, 20_000_000)], 2_000_000),  # spans many buckets
    ((2_999_000, 3_001_000), [(2_999_500, 3_000_500)], 1_000),  # across a bucket boundary
])
def test_nccl_breakdown_overlap_is_intersection_with_compute_union(probe, others, expected):
    con = make_model(kernels=[nccl(*probe), *[comp(s, e) for s, e in others]])
    result = run(con, start_ns=0, end_ns=20_000_000)
    assert (result.overlapped_ns, result.exposed_ns) == (expected, probe[1] - probe[0] - expected)


def test_nccl_breakdown_overlap_matches_reference_on_random_kernels():
    rng = random.Random(7)
    kernels, expected = [], 0
    for device in (0, 1):
        others = [(s, s + rng.randint(1, 3_000_000)) for s in (rng.randint(0, 50_000_000) for _ in range(300))]
        probes = [(s, s + rng.randint(1, 5_000_000)) for s in (rng.randint(0, 50_000_000) for _ in range(40))]
        kernels += [comp(s, e, device, stream=rng.choice([7, 8])) for s, e in others]
        kernels += [nccl(s, e, device) for s, e in probes]
        expected += sum(overlap_ns(p, others) for p in probes)
    assert run(make_model(kernels=kernels), start_ns=0, end_ns=60_000_000).overlapped_ns == expected


def test_nccl_breakdown_clips_to_the_window():
    con = make_model(kernels=[comp(0, 100), nccl(20, 60), nccl(70, 80)])
    result = run(con, start_ns=50, end_ns=75)
    assert (result.nccl_count, result.nccl_ns, result.overlapped_ns, result.window_pct) == (2, 15, 15, 60.0)


@pytest.mark.parametrize("ns, findings", [
    ((100, 100), []),  # balanced, low share, fully overlapped
    ((100, 40), ["nccl-straggler"]),  # spread 60 of mean 70
])
def test_nccl_breakdown_straggler_is_the_device_with_least_nccl_time(ns, findings):
    kernels = [comp(0, 1000, device=d) for d in (0, 1)] + [nccl(0, n, device=d) for d, n in enumerate(ns)]
    result = run(make_model(kernels=kernels))
    assert [f.root_cause for f in result.findings] == findings
    assert result.least_nccl_device == (1 if ns[1] < ns[0] else 0)


def test_nccl_breakdown_serialization_and_imbalance_fire_without_a_straggler():
    con = make_model(kernels=[comp(0, 40), nccl(40, 100), comp(0, 40, device=1), nccl(40, 100, device=1)])
    result = run(con)
    assert result.overlapped_pct == 0.0 and result.window_pct == 60.0
    assert [(f.root_cause, f.severity) for f in result.findings] == [
        ("nccl-serialization", "high"), ("compute-communication-imbalance", "medium")]


def test_nccl_breakdown_limit_caps_rows():
    con = make_model(kernels=[nccl(0, 10, coll="AllReduce"), nccl(20, 25, coll="AllGather"),
                              nccl(30, 32, coll="ReduceScatter")])
    result = run(con, limit=2)
    assert [r.collective for r in result.rows] == ["AllReduce", "AllGather"]
    assert (result.truncated, result.total_rows) == (True, 3)


def test_nccl_breakdown_without_nccl_says_so():
    result = run(make_model(kernels=[comp(0, 10)]))
    assert (result.has_nccl, result.nccl_count, result.rows, result.devices, result.findings) == (
        False, 0, [], [], [])
    assert "no NCCL kernels" in result.note and "no NCCL" in nb.render(result)


# --- golden on real exports ----------------------------------------------------------------------------
def raw_kernels(stem: str) -> list[tuple]:
    """(device, stream, start, end, is_nccl) straight from the export."""
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    rows = con.execute("""SELECT k.deviceId, k.streamId, k.start, k."end", s.value LIKE '%nccl%'
                          FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName""").fetchall()
    con.close()
    return rows


@pytest.mark.parametrize("stem", ["nsysai_mfu_2gpu_before", "nsysai_mfu_2gpu_after"])
def test_nccl_breakdown_matches_raw_export(open_fixture, stem):
    raw = raw_kernels(stem)
    result = nb.run(open_fixture(stem).con, nb.Params(profile=stem))
    for d in result.devices:
        mine = [(s, e) for dev, _, s, e, is_nccl in raw if dev == d.device and is_nccl]
        others = [(s, e) for dev, _, s, e, is_nccl in raw if dev == d.device and not is_nccl and e > s]
        assert (d.count, d.nccl_ns) == (len(mine), sum(e - s for s, e in mine))
        assert d.overlapped_ns == sum(overlap_ns(p, others) for p in mine)
    assert {d.device for d in result.devices} == {dev for dev, _, _, _, is_nccl in raw if is_nccl}
    shared = sorted({(dev, st) for dev, st, _, _, n in raw if n} & {(dev, st) for dev, st, _, _, n in raw if not n})
    assert [(s.device, s.stream) for s in result.nccl_on_compute_stream] == shared
    assert "nccl-on-compute-stream" in {f.root_cause for f in result.findings}


def test_nccl_breakdown_snapshot(open_fixture, snapshot):
    assert dump(nb.run(open_fixture("nsysai_mfu_2gpu_before").con, nb.Params(profile="p"))) == snapshot


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_nccl_breakdown_output_stays_small(open_fixture, stem):
    result = nb.run(open_fixture(stem).con, nb.Params(profile=stem))
    assert len(json.dumps(dump(result))) < 20_000
    assert nb.render(result)


# --- planted ----------------------------------------------------------------------------------------
def test_nccl_breakdown_finds_the_planted_straggler(demo):
    profile, truth = demo
    [straggler] = planted(truth, "nccl_straggler")
    result = nb.run(profile.con, nb.Params(profile="demo"))
    totals = {t["device"]: t for t in truth["totals"]["per_device"]}
    assert {d.device: (d.count, d.nccl_ns) for d in result.devices} == {
        dev: (t["nccl_kernels"], t["nccl_kernel_time_ns"]) for dev, t in totals.items()}
    assert result.least_nccl_device == straggler["device"]
    [finding] = [f for f in result.findings if f.root_cause == "nccl-straggler"]
    assert finding.device == straggler["device"]
    # each peer waits about delay_ns per collective: the spread is of that order
    assert finding.evidence["spread_ns"] >= straggler["count"] * straggler["peer_extra_ns"] / 2
    assert result.nccl_on_compute_stream == []


def test_nccl_breakdown_quiet_on_clean(clean):
    profile, _ = clean
    result = nb.run(profile.con, nb.Params(profile="clean"))
    assert result.has_nccl and result.findings == []


# --- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 5}, "device 5 is not in this profile"),
    ({"start_ns": 50, "end_ns": 50}, "is empty"),
    ({"start_ns": 10_000, "end_ns": 20_000}, "outside the capture"),
])
def test_nccl_breakdown_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(kernels=[comp(0, 100), nccl(10, 20)]), **kw)


def test_nccl_breakdown_rejects_the_empty_export(open_fixture):
    with pytest.raises(InvalidRequest):
        nb.run(open_fixture("dynamicvit_empty_export").con, nb.Params(profile="e"))
