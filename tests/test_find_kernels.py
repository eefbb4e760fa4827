"""find_kernels: name matching, ordering, caps with totals over all matches, NVTX path at launch."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, dump, planted
from modeldb import make_model

from stallhound.model.errors import InvalidRequest
from stallhound.tools import find_kernels as fk


def kern(name: str, s: int, e: int, *, tid: int | None = 10, launch: int | None = None, device: int = 0,
         short: str | None = None) -> dict:
    return {"device_id": device, "stream_id": 7, "pid": 1, "tid": tid, "start_ns": s, "end_ns": e,
            "short_name": short or name.split("<")[0], "name": name, "grid_x": 4, "grid_y": 1, "grid_z": 1,
            "block_x": 128, "block_y": 1, "block_z": 1, "launch_api": None if launch is None else "cudaLaunchKernel",
            "launch_start_ns": launch, "launch_end_ns": None if launch is None else launch + 2}


def rng(text: str, s: int, e: int | None, depth: int | None, tid: int = 10, kind: str = "push_pop") -> dict:
    return {"pid": 1, "tid": tid, "text": text, "start_ns": s, "end_ns": e, "kind": kind, "depth": depth}


NVTX = [rng("step", 0, 1000, 0), rng("forward", 10, 400, 1), rng("attn", 50, 60, 2), rng("mlp", 100, 200, 2),
        rng("open", 90, None, 3), rng("other thread", 0, 1000, 0, tid=11), rng("async", 0, 1000, None,
                                                                               kind="start_end")]
KERNELS = [kern("gemm_a<float>", 500, 530, launch=55), kern("GEMM_b", 520, 600, launch=150),
           kern("copy", 700, 705, launch=300), kern("gemm_c", 800, 802, launch=None, tid=None),
           kern("gemm_d", 900, 950, launch=20, tid=12)]


def run(con, **kw) -> fk.Result:
    return fk.run(con, fk.Params(profile="t", **kw))


def test_find_kernels_whole_result_on_tiny_model():
    result = run(make_model(kernels=KERNELS, nvtx=NVTX), pattern="gemm")
    assert (result.count, result.total_ns, result.mean_ns, result.min_ns, result.max_ns) == (4, 162, 40.5, 2, 80)
    assert (result.truncated, result.total_rows, result.distinct_names, result.note) == (False, 4, 4, None)
    assert result.matched_names == [fk.MatchedName(name="GEMM_b", count=1, total_ns=80),
                                    fk.MatchedName(name="gemm_d", count=1, total_ns=50),
                                    fk.MatchedName(name="gemm_a<float>", count=1, total_ns=30),
                                    fk.MatchedName(name="gemm_c", count=1, total_ns=2)]
    base = {"device": 0, "stream": 7, "pid": 1, "grid": [4, 1, 1], "block": [128, 1, 1]}
    assert [r.model_dump() for r in result.rows] == [
        {**base, "name": "gemm_a", "start_ns": 500, "end_ns": 530, "duration_ns": 30, "tid": 10,
         "launch_api": "cudaLaunchKernel", "launch_start_ns": 55, "nvtx_path": "step > forward > attn"},
        {**base, "name": "GEMM_b", "start_ns": 520, "end_ns": 600, "duration_ns": 80, "tid": 10,
         "launch_api": "cudaLaunchKernel", "launch_start_ns": 150, "nvtx_path": "step > forward > mlp > open"},
        {**base, "name": "gemm_c", "start_ns": 800, "end_ns": 802, "duration_ns": 2, "tid": None,
         "launch_api": None, "launch_start_ns": None, "nvtx_path": None},
        {**base, "name": "gemm_d", "start_ns": 900, "end_ns": 950, "duration_ns": 50, "tid": 12,
         "launch_api": "cudaLaunchKernel", "launch_start_ns": 20, "nvtx_path": ""},
    ]


@pytest.mark.parametrize("launch, path", [
    (10, "step > forward"),  # a range that starts exactly at launch is open
    (400, "step > open"),  # one that ends exactly at launch is closed
    (999, "step > open"),
    (1000, "open"),  # unclosed ranges stay open
])
def test_find_kernels_nvtx_path_boundaries(launch, path):
    result = run(make_model(kernels=[kern("k", 1000, 1001, launch=launch)], nvtx=NVTX), pattern="k")
    assert result.rows[0].nvtx_path == path


@pytest.mark.parametrize("pattern, regex, names", [
    ("GEMM", False, ["gemm_a<float>", "GEMM_b", "gemm_c", "gemm_d"]),
    ("<float>", False, ["gemm_a<float>"]),
    ("_", False, ["gemm_a<float>", "GEMM_b", "gemm_c", "gemm_d"]),  # literal, not a LIKE wildcard
    ("%", False, []),
    ("^gemm_[ab]", True, ["gemm_a<float>", "GEMM_b"]),
    ("co.y$", True, ["copy"]),
    ("float", True, ["gemm_a<float>"]),
])
def test_find_kernels_matching(pattern, regex, names):
    result = run(make_model(kernels=KERNELS), pattern=pattern, regex=regex)
    assert sorted(n.name for n in result.matched_names) == sorted(names)
    assert result.count == len(names)


def test_find_kernels_matches_short_name_when_demangled_differs():
    kernels = [kern("void ns::launch<T>(int)", 0, 5, short="vectorized_elementwise_kernel")]
    assert run(make_model(kernels=kernels), pattern="elementwise").count == 1


def test_find_kernels_order_and_cap_keep_totals_of_all_matches():
    kernels = [kern("k", i * 100, i * 100 + d) for i, d in enumerate([5, 50, 20, 50, 1])]
    by_time = run(make_model(kernels=kernels), pattern="k", limit=2)
    assert [r.start_ns for r in by_time.rows] == [0, 100]
    assert (by_time.truncated, by_time.total_rows, by_time.count, by_time.total_ns, by_time.mean_ns) == (
        True, 5, 5, 126, 25.2)
    by_duration = run(make_model(kernels=kernels), pattern="k", order="duration", limit=3)
    assert [(r.duration_ns, r.start_ns) for r in by_duration.rows] == [(50, 100), (50, 300), (20, 200)]


def test_find_kernels_scope_device_and_window():
    kernels = [kern("k", 0, 5), kern("k", 10, 15, device=1), kern("k", 20, 25)]
    result = run(make_model(kernels=kernels), pattern="k", device=0, start_ns=1, end_ns=30)
    assert [(r.device, r.start_ns) for r in result.rows] == [(0, 20)]


def test_find_kernels_no_match_and_no_nvtx_notes():
    con = make_model(kernels=KERNELS)
    assert "no kernel name contains 'zzz'" in run(con, pattern="zzz").note
    assert run(con, pattern="zzz").rows == []
    assert "no NVTX ranges" in run(con, pattern="gemm").note


# --- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"pattern": "gemm(", "regex": True}, "not a valid RE2 regular expression .*missing \\)"),
    ({"pattern": "[a-", "regex": True}, "not a valid RE2"),
    ({"pattern": "k", "device": 3}, "device 3 is not in this profile"),
    ({"pattern": "k", "start_ns": 600, "end_ns": 500}, "is empty"),
    ({"pattern": "k", "start_ns": 5000, "end_ns": 6000}, "outside the capture"),
])
def test_find_kernels_rejects_bad_requests(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(kernels=KERNELS), **kw)


def test_find_kernels_params_validation():
    with pytest.raises(ValueError):
        fk.Params(profile="t", pattern="")
    with pytest.raises(ValueError):
        fk.Params(profile="t", pattern="k", order="name")


def test_find_kernels_empty_export_has_no_window(open_fixture):
    with pytest.raises(InvalidRequest, match="no timed events"):
        run(open_fixture("dynamicvit_empty_export").con, pattern="k")


# --- golden: real exports against independent SQL on the raw SQLite --------------------------------
def raw(stem: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)


@pytest.mark.parametrize("stem, pattern", [("nsysai_mfu_2gpu_before", "flash"), ("nsysai_h100_2gpu_1s", "gemm"),
                                           ("nsysai_mfu_2gpu_after", "nccl"), ("clue_t4_report4", "cluster")])
def test_find_kernels_golden_totals(open_fixture, stem, pattern):
    con = raw(stem)
    count, total, low, high = con.execute(
        """SELECT count(*), sum(k."end" - k.start), min(k."end" - k.start), max(k."end" - k.start)
           FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName
           JOIN StringIds s ON s.id = k.shortName
           WHERE d.value LIKE '%' || ? || '%' OR s.value LIKE '%' || ? || '%'""", (pattern, pattern)).fetchone()
    first = con.execute(
        """SELECT k.start, k."end", k.deviceId, k.streamId, k.gridX, k.blockX FROM CUPTI_ACTIVITY_KIND_KERNEL k
           JOIN StringIds d ON d.id = k.demangledName WHERE d.value LIKE '%' || ? || '%'
           ORDER BY k.start, k.deviceId LIMIT 1""", (pattern,)).fetchone()
    result = run(open_fixture(stem).con, pattern=pattern)
    assert (result.count, result.total_ns, result.min_ns, result.max_ns) == (count, total, low, high)
    assert count > 0
    r = result.rows[0]
    assert (r.start_ns, r.end_ns, r.device, r.stream, r.grid[0], r.block[0]) == first


def test_find_kernels_golden_nvtx_paths(open_fixture):
    """Paths of the returned rows against a per-kernel lookup in the raw export (event type 59 = push/pop)."""
    stem = "nsysai_mfu_2gpu_before"
    result = run(open_fixture(stem).con, pattern="flash", limit=40)
    con = raw(stem)
    checked = 0
    for row in result.rows:
        launch = con.execute(
            """SELECT r.start, r.globalTid FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
               ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)
               WHERE k.start = ? AND k.deviceId = ?""", (row.start_ns, row.device)).fetchone()
        if launch is None:
            assert row.nvtx_path is None
            continue
        texts = [t for (t,) in con.execute(
            """SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
               WHERE n.eventType = 59 AND n.globalTid = ? AND n.start <= ? AND (n."end" > ? OR n."end" IS NULL)
               ORDER BY n.start, n."end" DESC""", (launch[1], launch[0], launch[0]))]
        assert (row.launch_start_ns, row.nvtx_path) == (launch[0], " > ".join(texts))
        checked += bool(texts)
    assert checked >= 30


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_find_kernels_result_stays_small(open_fixture, stem):
    try:
        result = run(open_fixture(stem).con, pattern="e")
    except InvalidRequest:
        assert stem == "dynamicvit_empty_export"
        return
    assert len(result.model_dump_json()) < 20_000
    assert fk.render(result)


def test_find_kernels_snapshot(open_fixture, snapshot):
    result = run(open_fixture("nsysai_mfu_2gpu_before").con, pattern="nccl", order="duration", limit=5)
    assert dump(result) == snapshot


# --- planted vs found ------------------------------------------------------------------------------
def test_find_kernels_finds_planted_tiny_kernels_in_optimizer(demo):
    profile, truth = demo
    tiny = planted(truth, "tiny_kernels")
    result = run(profile.con, pattern="rsqrt", order="duration", limit=50)
    assert result.count * 3 == sum(p["count"] for p in tiny)  # rsqrt is one of the three tiny ops, in turn
    assert result.max_ns <= max(p["max_kernel_ns"] for p in tiny)
    assert {r.device for r in result.rows} <= set(truth["devices"])
    assert all(r.nvtx_path.endswith("> optimizer") and r.nvtx_path.startswith("iteration ") for r in result.rows)
    for p in tiny:
        on_device = run(profile.con, pattern="rsqrt", device=p["device"], order="time", limit=1)
        assert on_device.rows[0].start_ns >= p["start_ns"]


def test_find_kernels_quiet_on_clean(clean):
    profile, _ = clean
    result = run(profile.con, pattern="rsqrt")
    assert (result.count, result.rows) == (0, [])
    assert result.note
