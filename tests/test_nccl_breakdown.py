"""nccl_breakdown: NCCL time per collective/stream/device, overlap with compute, shared streams, per-collective
arrival across devices (matching, skew, straggler) and per-device findings with disjoint time at stake."""

from __future__ import annotations

import random
import sqlite3
import statistics

import pytest
from conftest import FIXTURES, dump, planted
from modeldb import make_model, union_ns

from stallhound.analysis import nccl_arrival as na
from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import nccl_breakdown as nb

US = 1_000
MS = 1_000_000
PERIOD = 2 * MS  # collective i of the tiny models starts at i x PERIOD


def comp(s: int, e: int, device: int = 0, stream: int = 7) -> dict:
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "short_name": "gemm",
            "name": "gemm", "category": "compute"}


def nccl(s: int, e: int, device: int = 0, stream: int = 21, coll: str = "AllReduce") -> dict:
    name = f"ncclDevKernel_{coll}_Sum_f32_RING_LL"
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "short_name": name, "name": name,
            "category": "nccl", "nccl_collective": coll}


def collective(i: int, late: dict[int, int], transfer: int = 400 * US, jitter: int = 0, stream: int = 21) -> list[dict]:
    """Collective i: device d's kernel starts late[d] after i x PERIOD; all end `transfer` after the last start,
    device d another d x jitter later (ranks finish within microseconds of each other)."""
    base = i * PERIOD
    last = base + max(late.values())
    return [nccl(base + off, last + transfer + d * jitter, device=d, stream=stream) for d, off in late.items()]


def series(count: int, late, **kw) -> list[dict]:
    """`count` collectives, late(i) giving each one's arrival offsets."""
    return [k for i in range(count) for k in collective(i, late(i), **kw)]


def run(con, **kw) -> nb.Result:
    return run_skill(con, nb, nb.Params(profile="t", **kw))


def overlap_ns(probe: tuple[int, int], others: list[tuple[int, int]]) -> int:
    s, e = probe
    return union_ns([(max(a, s), min(b, e)) for a, b in others if b > s and a < e])


def stakes(result: nb.Result) -> list[tuple[str, int | None, int]]:
    return [(f.root_cause, f.device, f.time_at_stake_ns) for f in result.findings]


# --- unit: time, overlap, shared streams --------------------------------------------------------------
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
        nb.DeviceNccl(device=0, count=2, nccl_ns=37, mean_ns=18.5, window_pct=61.67, overlapped_ns=12,
                      overlapped_pct=32.43, exposed_ns=25, collectives=["AllGather", "AllReduce"]),
        nb.DeviceNccl(device=1, count=1, nccl_ns=10, mean_ns=10.0, window_pct=16.67, overlapped_ns=10,
                      overlapped_pct=100.0, exposed_ns=0, collectives=["AllReduce"])]
    assert (result.spread_ns, result.spread_pct) == (27, 114.89)
    assert result.nccl_on_compute_stream == [
        nb.SharedStream(device=0, stream=7, nccl_kernels=1, compute_kernels=3, compute_share_pct=100.0, exposed_ns=10)]
    # the AllReduce pair matches (device 1 arrives 2 ns late); the lone AllGather has no peer
    assert result.arrival == na.Arrival(
        matched=1, matched_kernels=2, unmatched_kernels=1, median_skew_ns=2, p90_skew_ns=2, median_transfer_ns=10,
        skew_threshold_ns=na.MIN_SKEW_NS,
        devices=[na.DeviceArrival(device=0, collectives=1, last_count=0, last_share_pct=0.0, wait_ns=2,
                                  straggler_wait_ns=0),
                 na.DeviceArrival(device=1, collectives=1, last_count=1, last_share_pct=100.0, wait_ns=0,
                                  straggler_wait_ns=0)],
        worst=[na.SkewedCollective(collective="AllReduce", first_arrival_ns=8, last_arrival_ns=10, skew_ns=2,
                                   last_device=1, transfer_ns=10)],
        straggler_device=None,
        verdict=f"only 1 collectives matched across devices: too few to tell a habit from chance "
                f"(at least {na.MIN_MATCHED} needed)")
    # device 0: 25 ns exposed (41.7% of the window), only 10 of it on the shared stream 7, so the stream layout
    # is not what keeps it exposed; 2 ns of it it waits for device 1, which no overlap recovers; device 1 is fully
    # overlapped. No framework or c10d op in the trace: no variant, the book's plain fix.
    assert [(f.root_cause, f.device, f.time_at_stake_ns, f.tags) for f in result.findings] == [
        ("nccl-serialization", 0, 23, [])]


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


def test_nccl_breakdown_limit_caps_rows():
    con = make_model(kernels=[nccl(0, 10, coll="AllReduce"), nccl(20, 25, coll="AllGather"),
                              nccl(30, 32, coll="ReduceScatter")])
    result = run(con, limit=2)
    assert [r.collective for r in result.rows] == ["AllReduce", "AllGather"]
    assert (result.truncated, result.total_rows) == (True, 3)


def test_nccl_breakdown_without_nccl_says_so():
    result = run(make_model(kernels=[comp(0, 10)]))
    assert (result.has_nccl, result.nccl_count, result.rows, result.devices, result.arrival, result.findings) == (
        False, 0, [], [], None, [])
    assert "no NCCL kernels" in result.note and "no NCCL" in nb.render(result)


# --- unit: arrival -----------------------------------------------------------------------------------
def straggler_series(i: int) -> dict[int, int]:
    """Device 1 arrives 500 us late to collectives 0-7; device 0 is 300 us and 900 us late to 8 and 9."""
    return {0: 0, 1: 500 * US} if i < 8 else {0: (300 if i == 8 else 900) * US, 1: 0}


def test_nccl_breakdown_arrival_whole_result_with_a_straggler():
    result = run(make_model(kernels=series(10, straggler_series)))
    assert result.arrival == na.Arrival(
        matched=10, matched_kernels=20, unmatched_kernels=0, median_skew_ns=500 * US,
        p90_skew_ns=540 * US,  # skews 300, 500 x 8, 900: 500 + 0.1 x (900 - 500)
        median_transfer_ns=400 * US, skew_threshold_ns=200 * US,  # half the transfer, above MIN_SKEW_NS
        devices=[na.DeviceArrival(device=0, collectives=10, last_count=2, last_share_pct=20.0, wait_ns=4 * MS,
                                  straggler_wait_ns=4 * MS),
                 na.DeviceArrival(device=1, collectives=10, last_count=8, last_share_pct=80.0, wait_ns=1_200 * US,
                                  straggler_wait_ns=0)],
        worst=[na.SkewedCollective(collective="AllReduce", first_arrival_ns=18 * MS, last_arrival_ns=18_900 * US,
                                   skew_ns=900 * US, last_device=0, transfer_ns=400 * US)]
        + [na.SkewedCollective(collective="AllReduce", first_arrival_ns=i * PERIOD,
                               last_arrival_ns=i * PERIOD + 500 * US, skew_ns=500 * US, last_device=1,
                               transfer_ns=400 * US) for i in range(4)],
        straggler_device=1,
        verdict="straggler: device 1 arrives last to 8 of 10 collectives (80.0%); median skew 0.500 ms")
    # window 0..19.3 ms. Device 0: 8 ms of NCCL, 4 ms of it waiting for device 1, the other 4 ms exposed;
    # device 1: 5.2 ms of NCCL, none spent waiting for the straggler (itself) but 1.2 ms waiting for device 0 in the
    # two collectives device 0 reached last: serialization is the 4 ms left
    assert stakes(result) == [("nccl-straggler", 0, 4 * MS), ("nccl-serialization", 0, 4 * MS),
                              ("nccl-serialization", 1, 4 * MS)]
    straggler = result.findings[0]
    assert (straggler.severity, straggler.evidence) == ("high", {
        "late_device": 1, "late_last_share_pct": 80.0, "late_last_count": 8, "median_skew_ns": 500 * US,
        "wait_ns": 4 * MS, "wait_window_pct": 20.73})
    assert "straggler: device 1" in nb.render(result)


def skews(i: int) -> dict[int, int]:
    """Device 1 arrives (i + 1) x 10 us after device 0; device 2 (when present) 5 us after device 0."""
    return {0: 0, 1: (i + 1) * 10 * US, 2: 5 * US}


@pytest.mark.parametrize("devices, cut, matched, unmatched, median_skew", [
    ((0, 1), {}, 12, 0, 65 * US),  # equal counts: the k-th instances pair up
    ((0, 1), {(1, 0)}, 11, 1, 70 * US),  # device 1's first collective cut: the others still pair up
    ((0, 1), {(0, 11)}, 11, 1, 60 * US),  # device 0's last collective cut
    ((0, 1), {(1, 0), (0, 11)}, 10, 2, 65 * US),  # cut at both ends, on different devices
    ((0, 1, 2), {(2, 0), (2, 1)}, 10, 4, 75 * US),  # two cut on one of three devices
])
def test_nccl_breakdown_matching_survives_cut_ends(devices, cut, matched, unmatched, median_skew):
    kernels = [k for i in range(12) for k in collective(i, {d: skews(i)[d] for d in devices}, jitter=3 * US)
               if (k["device_id"], k["start_ns"] // PERIOD) not in cut]
    arrival = run(make_model(kernels=kernels)).arrival
    kept = [i for i in range(12) if not any((d, i) in cut for d in devices)]
    assert (arrival.matched, arrival.unmatched_kernels, arrival.median_skew_ns) == (matched, unmatched, median_skew)
    assert [w.skew_ns for w in arrival.worst] == [(i + 1) * 10 * US for i in sorted(kept, reverse=True)[:5]]
    assert [d.collectives for d in arrival.devices] == [matched] * len(devices)


@pytest.mark.parametrize("count, late, transfer, straggler, verdict", [
    (12, lambda i: {0: 0, 1: 500 * US} if i % 2 else {0: 500 * US, 1: 0}, 400 * US, None, "balanced: "),
    (12, lambda i: {0: 0, 1: 500 * US}, 400 * US, 1, "straggler: device 1 arrives last to 12 of 12"),
    (12, lambda i: {0: 0, 1: 80 * US}, 100 * US, None, "below 0.100 ms: too small"),  # under MIN_SKEW_NS
    (12, lambda i: {0: 0, 1: 600 * US}, 2 * MS, None, "below 1.000 ms: too small"),  # under half the transfer
    (9, lambda i: {0: 0, 1: 500 * US}, 400 * US, None, "only 9 collectives matched"),  # under MIN_MATCHED
    (12, lambda i: {0: 0, 1: 500 * US if i >= 8 else 0, 2: 500 * US if i < 8 else 0}, 400 * US, None,
     "balanced: no device arrives last to 75% of collectives; most often device 2 arrives last to 8 of 12"),
    (12, lambda i: {0: 0, 1: 500 * US if i >= 9 else 0, 2: 500 * US if i < 9 else 0}, 400 * US, 2,
     "straggler: device 2 arrives last to 9 of 12 collectives (75.0%)"),
])
def test_nccl_breakdown_names_a_straggler_only_when_arrival_is_unbalanced(count, late, transfer, straggler, verdict):
    result = run(make_model(kernels=series(count, late, transfer=transfer)))
    assert result.arrival.straggler_device == straggler and verdict in result.arrival.verdict
    late_devices = {f.evidence["late_device"] for f in result.findings if f.root_cause == "nccl-straggler"}
    assert late_devices == ({straggler} if straggler is not None else set())


def shared_stream_case() -> list[dict]:
    """Device 1 late to all 12 collectives; device 0 runs its NCCL kernels on compute stream 7, between compute."""
    kernels = series(12, lambda i: {0: 0, 1: 500 * US})
    for k in kernels:
        k["stream_id"] = 7 if k["device_id"] == 0 else k["stream_id"]
    return kernels + [comp(i * PERIOD + 950 * US, i * PERIOD + 1_900 * US) for i in range(12)]


@pytest.mark.parametrize("kernels, expected", [
    # device 1 late to all: device 0 waits 12 x 500 us; of its 10.8 ms exposed NCCL time, 4.8 ms is left, all of
    # it on the compute stream 7; device 1 (own stream) has its 4.8 ms exposed, 20.1% of the 23.9 ms window
    (shared_stream_case(),
     [("nccl-straggler", 0, 6 * MS), ("nccl-on-compute-stream", 0, 4_800 * US), ("nccl-serialization", 1, 4_800 * US)]),
    # late rank alternates, 500 us skew: no straggler; each device waits 6 x 500 us, NCCL 34% of the window
    (series(12, lambda i: {0: 0, 1: 500 * US} if i % 2 else {0: 500 * US, 1: 0}),
     [("compute-communication-imbalance", 0, 3 * MS), ("compute-communication-imbalance", 1, 3 * MS)]),
    # 20 us skews on a 1 ms transfer: arrival is balanced and tight, the exposed time is plain serialization,
    # less the 6 x 20 us each device waits for the other
    (series(12, lambda i: {0: 0, 1: 20 * US} if i % 2 else {0: 20 * US, 1: 0}, transfer=1 * MS),
     [("nccl-serialization", 0, 12 * MS), ("nccl-serialization", 1, 12 * MS)]),
    # compute on another stream hides every NCCL kernel: only the wait for the straggler is at stake
    (series(12, lambda i: {0: 0, 1: 500 * US}) + [comp(0, 24 * MS, device=d) for d in (0, 1)],
     [("nccl-straggler", 0, 6 * MS)]),
])
def test_nccl_breakdown_stakes_are_per_device_and_disjoint(kernels, expected):
    result = run(make_model(kernels=kernels))
    assert stakes(result) == expected
    waits = {a.device: a for a in result.arrival.devices}
    for d in result.devices:
        mine = [f.time_at_stake_ns for f in result.findings if f.device == d.device]
        others = [f.time_at_stake_ns for f in result.findings
                  if f.device == d.device and f.root_cause != "nccl-straggler"]
        serialization = [f.time_at_stake_ns for f in result.findings
                         if f.device == d.device and f.root_cause == "nccl-serialization"]
        assert sum(mine) <= d.nccl_ns and len(others) <= 1
        assert sum(others) <= d.exposed_ns - waits[d.device].straggler_wait_ns or sum(others) == 0
        assert sum(serialization) <= d.exposed_ns - waits[d.device].wait_ns or not serialization  # never a wait


def test_nccl_breakdown_arrival_in_a_window_that_cuts_collectives():
    kernels = series(12, lambda i: {0: 0, 1: 500 * US})
    # starts inside collective 0 after device 0 arrived; ends after device 0 arrived at collective 11 but
    # before device 1 did: that kernel has no partner in the window
    arrival = run(make_model(kernels=kernels), start_ns=600 * US, end_ns=11 * PERIOD + 100 * US).arrival
    assert (arrival.matched, arrival.unmatched_kernels, arrival.median_skew_ns) == (11, 1, 500 * US)
    # device 0's wait in collective 0 lies before the window; collectives 1-10 count in full
    assert [(a.device, a.last_count, a.wait_ns, a.straggler_wait_ns) for a in arrival.devices] == [
        (0, 0, 5 * MS, 5 * MS), (1, 11, 0, 0)]
    assert arrival.straggler_device == 1


def test_nccl_breakdown_arrival_needs_two_devices_in_scope():
    result = run(make_model(kernels=series(12, lambda i: {0: 0, 1: 500 * US})), device=0)
    assert (result.arrival.matched, result.arrival.unmatched_kernels, result.arrival.straggler_device) == (0, 12, None)
    assert "omit `device`" in result.arrival.verdict
    assert "nccl-straggler" not in {f.root_cause for f in result.findings}


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
    result = run_skill(open_fixture(stem).con, nb, nb.Params(profile=stem))
    for d in result.devices:
        mine = [(s, e) for dev, _, s, e, is_nccl in raw if dev == d.device and is_nccl]
        others = [(s, e) for dev, _, s, e, is_nccl in raw if dev == d.device and not is_nccl and e > s]
        assert (d.count, d.nccl_ns) == (len(mine), sum(e - s for s, e in mine))
        assert d.overlapped_ns == sum(overlap_ns(p, others) for p in mine)
    assert {d.device for d in result.devices} == {dev for dev, _, _, _, is_nccl in raw if is_nccl}
    shared = sorted({(dev, st) for dev, st, _, _, n in raw if n} & {(dev, st) for dev, st, _, _, n in raw if not n})
    assert [(s.device, s.stream) for s in result.nccl_on_compute_stream] == shared
    assert "nccl-on-compute-stream" in {f.root_cause for f in result.findings}


@pytest.mark.parametrize("stem, last_counts", [
    ("nsysai_mfu_2gpu_before", {0: 11, 1: 22}),  # device 1 last to 2 in 3: not the clear majority of a straggler
    ("nsysai_mfu_2gpu_after", {0: 15, 1: 16}),
])
def test_nccl_breakdown_arrival_matches_raw_starts(open_fixture, stem, last_counts):
    """Every SendRecv is in the window on both devices, so the k-th kernels of the two devices pair up."""
    result = run_skill(open_fixture(stem).con, nb, nb.Params(profile=stem))
    starts = {d: sorted((s, e) for dev, _, s, e, is_nccl in raw_kernels(stem) if dev == d and is_nccl) for d in (0, 1)}
    pairs = list(zip(starts[0], starts[1], strict=True))
    last = [max((0, 1), key=lambda d: (pair[d][0], -d)) for pair in pairs]
    skew = [abs(a[0] - b[0]) for a, b in pairs]
    waits = {d: sum(max(0, min(pair[late][0], pair[d][1]) - pair[d][0]) for pair, late in zip(pairs, last, strict=True))
             for d in (0, 1)}
    arrival = result.arrival
    assert {d: last.count(d) for d in (0, 1)} == last_counts
    assert [(a.device, a.collectives, a.last_count, a.wait_ns) for a in arrival.devices] == [
        (d, len(pairs), last_counts[d], waits[d]) for d in (0, 1)]
    assert (arrival.matched, arrival.unmatched_kernels) == (len(pairs), 0)
    assert arrival.median_skew_ns == round(statistics.median(skew))
    assert arrival.p90_skew_ns == round(statistics.quantiles(skew, n=10, method="inclusive")[8])
    assert arrival.median_transfer_ns == round(statistics.median(
        pair[late][1] - pair[late][0] for pair, late in zip(pairs, last, strict=True)))
    assert arrival.straggler_device is None and arrival.verdict.startswith("balanced: ")
    assert "nccl-straggler" not in {f.root_cause for f in result.findings}


def test_nccl_breakdown_snapshot(open_fixture, snapshot):
    assert dump(run_skill(open_fixture("nsysai_mfu_2gpu_before").con, nb, nb.Params(profile="p"))) == snapshot


# --- planted ----------------------------------------------------------------------------------------
def test_nccl_breakdown_finds_the_planted_straggler(demo):
    profile, truth = demo
    [straggler] = planted(truth, "nccl_straggler")
    result = run_skill(profile.con, nb, nb.Params(profile="demo"))
    totals = {t["device"]: t for t in truth["totals"]["per_device"]}
    assert {d.device: (d.count, d.nccl_ns) for d in result.devices} == {
        dev: (t["nccl_kernels"], t["nccl_kernel_time_ns"]) for dev, t in totals.items()}
    arrival, late = result.arrival, straggler["device"]
    collectives = [{p["device"]: (p["start_ns"], p["end_ns"]) for p in c["per_device"]} for c in truth["collectives"]]
    assert (arrival.matched, arrival.unmatched_kernels) == (len(collectives), 0)
    assert arrival.straggler_device == late
    [mine] = [a for a in arrival.devices if a.device == late]
    assert mine.last_count == straggler["count"]
    skews = [max(s for s, _ in c.values()) - min(s for s, _ in c.values()) for c in collectives]
    assert arrival.median_skew_ns == round(statistics.median(skews))
    assert abs(arrival.median_skew_ns - straggler["lateness_ns"]) < 0.1 * straggler["lateness_ns"]
    # each peer's stake: its NCCL kernel time before the straggler's start, over the collectives it was last to
    delayed = [c for c in collectives if max(c, key=lambda d: (c[d][0], -d)) == late]
    found = [f for f in result.findings if f.root_cause == "nccl-straggler"]
    assert [f.device for f in found] == straggler["peer_devices"]
    assert [f.time_at_stake_ns for f in found] == [
        sum(min(c[late][0], c[peer][1]) - c[peer][0] for c in delayed) for peer in straggler["peer_devices"]]
    assert {f.evidence["late_device"] for f in found} == {late}
    assert result.nccl_on_compute_stream == []


def test_nccl_breakdown_quiet_on_clean(clean):
    profile, _ = clean
    result = run_skill(profile.con, nb, nb.Params(profile="clean"))
    assert result.has_nccl and result.findings == []
    assert result.arrival.straggler_device is None and result.arrival.verdict.startswith("balanced: ")


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
        run_skill(open_fixture("dynamicvit_empty_export").con, nb, nb.Params(profile="e"))
