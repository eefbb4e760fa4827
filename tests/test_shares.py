"""shares: device-time shares from interval unions, each 0-100, and the run's classification."""

from __future__ import annotations

import pytest
from conftest import FIXTURE_IDS
from modeldb import make_model, union_ns

from stallhound.analysis import common, shares

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def k(s: int, e: int, category: str = "compute", device: int = 0) -> dict:
    return {"device_id": device, "stream_id": 7, "pid": 1, "start_ns": s, "end_ns": e, "short_name": "k",
            "name": "k", "category": category}


def classify(con, fired=frozenset(), **kw) -> shares.Classification:
    scope = common.resolve_scope(con, common.ScopedParams(profile="t", **kw), default="gpu_active")
    return shares.classify(con, scope, set(fired))


def test_shares_are_unions_and_overlap_is_reported_once():
    con = make_model(kernels=[k(0, 100), k(50, 150, "copy"), k(100, 200, "nccl")],
                     memcpy=[{"device_id": 0, "stream_id": 3, "start_ns": 150, "end_ns": 250, "bytes": 8}],
                     memset=[{"device_id": 0, "stream_id": 3, "start_ns": 280, "end_ns": 300, "bytes": 8}])
    c = classify(con)
    # window 0-300: compute (incl. the copy kernel) 0-150, communication 100-200, transfer 150-250 and 280-300
    assert c.model_dump() == {
        "bound": "too little GPU activity", "compute_pct": 50.0, "copy_kernel_pct": 33.33, "transfer_pct": 40.0,
        "communication_pct": 33.33, "communication_families": ["NCCL"], "busy_pct": 90.0, "idle_pct": 10.0,
        "overlap_pct": 33.33, "gpu_ops": 5, "reason": c.reason, "shares_basis": "measured"}
    assert shares.families_note(c) == ""


def test_shares_name_the_communication_libraries_beside_nccl():
    kernels = [k(0, 100), {**k(100, 400, "nccl"), "comm_family": "expert-parallel"},
               {**k(400, 500, "nccl"), "comm_family": "NCCL"}]
    c = classify(make_model(kernels=kernels))
    assert (c.communication_pct, c.communication_families) == (80.0, ["expert-parallel", "NCCL"])
    assert shares.families_note(c) == " (expert-parallel, NCCL)"


@pytest.mark.parametrize("kernels, fired, bound", [
    ([(i * 200_000, i * 200_000 + 190_000) for i in range(20)], (), "compute-bound"),
    ([(i * 200_000, i * 200_000 + 100_000) for i in range(20)], ("cpu-bottleneck",), "host-bound"),
    ([(i * 200_000, i * 200_000 + 100_000) for i in range(20)], ("kernel-hotspot",), "idle-dominated"),
    ([(i * 1_000, i * 1_000 + 500) for i in range(20)], (), "too little GPU activity"),  # 10 us of work
    ([(0, 5_000_000)] * 5, (), "too little GPU activity"),  # five operations, 5 ms of GPU work: a one-shot run
    ([(i * 6_000_000, i * 6_000_000 + 5_000_000) for i in range(5)], (), "compute-bound"),  # five adding up to
    # 25 ms: a workload (one long kernel, a few GEMMs)
])
def test_shares_classification(kernels, fired, bound):
    assert classify(make_model(kernels=[k(s, e) for s, e in kernels]), fired).bound == bound


def test_shares_communication_bound():
    con = make_model(kernels=[k(i * 1_000_000, i * 1_000_000 + 900_000, "nccl" if i % 4 else "compute")
                              for i in range(20)])
    c = classify(con)
    assert (c.bound, c.communication_pct, c.compute_pct) == ("communication-bound", 67.84, 22.61)  # of 19.9 ms


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_shares_busy_is_the_mean_union_over_devices(open_fixture, stem):
    con = open_fixture(stem).con
    scope = common.resolve_scope(con, common.ScopedParams(profile=stem), default="gpu_active")
    c = shares.classify(con, scope, set())
    busy = 0
    for device in scope.devices:
        work = con.execute("""SELECT greatest(start_ns, $s), least(end_ns, $e) FROM (
            SELECT device_id, start_ns, end_ns FROM kernels UNION ALL SELECT device_id, start_ns, end_ns FROM memcpy
            UNION ALL SELECT device_id, start_ns, end_ns FROM memset)
            WHERE device_id = $d AND end_ns > $s AND start_ns < $e AND end_ns > start_ns""",
                           {"s": scope.start_ns, "e": scope.end_ns, "d": device}).fetchall()
        busy += union_ns(work)
    assert c.busy_pct == round(100 * busy / (scope.duration_ns * len(scope.devices)), 2)
    assert all(0 <= x <= 100 for x in (c.compute_pct, c.transfer_pct, c.communication_pct, c.idle_pct))
