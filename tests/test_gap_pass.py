"""gap_pass: each device's idle gaps from the chunked numpy pass equal a brute-force sweep, whatever the chunk size."""

from __future__ import annotations

import random

import pytest
from conftest import FIXTURE_IDS
from modeldb import make_model

from stallhound.analysis import attribution, common, device_pass, gap_pass, rules

TINY = rules.TINY_KERNEL_NS
GAP_COLUMNS = "gap_id, device_id, start_ns, end_ns, duration_ns, launch_end_ns, tiny, pid, tid, prev_pid, prev_tid"


def gaps(con, scope) -> list[tuple]:
    with gap_pass.idle_gaps(con, scope, TINY, 0):
        return con.execute(f"SELECT {GAP_COLUMNS} FROM idle_gaps ORDER BY gap_id").fetchall()


def brute_force(kernels: list[dict], scope) -> list[tuple[tuple, set, set]]:
    """Per gap, its row but the threads, the threads it may name (operations starting together may tie) and the
    previous threads it may name (traced operations before it ending where it begins)."""
    found = []
    for device in scope.devices:
        ops = sorted([(max(k["start_ns"], scope.start_ns), min(k["end_ns"], scope.end_ns), k) for k in kernels
                      if k["device_id"] == device and k["end_ns"] > scope.start_ns and k["start_ns"] < scope.end_ns],
                     key=lambda op: op[:2])
        reach, reach_tiny, row = scope.start_ns, False, 1  # the window's start is row 1
        for i, (s, e, _) in enumerate(ops + [(scope.end_ns, scope.end_ns, None)]):
            if s > reach:
                run = [k for s2, _, k in ops[i:] if s2 == s]
                ends = [k["launch_end_ns"] for k in run if k.get("launch_end_ns") is not None]
                traced = [k for k in run if k["tid"] is not None]
                key = {id(k): (k.get("launch_end_ns") is None, k.get("launch_end_ns") or 0) for k in traced}
                threads = {(k["pid"], k["tid"]) for k in traced if key[id(k)] == min(key.values())} or {(None, None)}
                tiny = any(k["end_ns"] - k["start_ns"] < TINY for k in run) or reach_tiny
                gap_id = device * gap_pass.GAP_ID_STRIDE + row
                prevs = {(k["pid"], k["tid"]) for _, e2, k in ops[:i] if e2 == reach and k["tid"] is not None}
                found.append(((gap_id, device, reach, s, s - reach, min(ends, default=None), tiny), threads,
                              prevs or {(None, None)}))
            if i < len(ops):
                tiny_end = ops[i][2]["end_ns"] - ops[i][2]["start_ns"] < TINY
                reach_tiny = (reach_tiny or tiny_end) if e == reach else (tiny_end if e > reach else reach_tiny)
                reach, row = max(reach, e), row + 1
    return found


def random_kernels(rng: random.Random) -> list[dict]:
    kernels = []
    for n in range(rng.randint(1, 30)):
        s = rng.choice([rng.randrange(0, 200_000, 10_000), rng.randrange(0, 200_000)])  # starts often tie
        e = s + rng.choice([500, 1_500, 3_000, rng.randrange(1, 40_000)])
        launch = rng.choice([None, s - rng.randrange(-5_000, 20_000)])
        traced = rng.random() < 0.8
        kernels.append({"device_id": rng.choice([0, 0, 1]), "stream_id": 7, "pid": 1 if traced or n % 2 else None,
                        "tid": rng.randrange(7, 11) if traced else None, "correlation_id": n, "start_ns": s,
                        "end_ns": e, "short_name": f"k{n}", "name": f"k{n}", "category": "compute",
                        **({} if launch is None else {"launch_start_ns": launch - 100, "launch_end_ns": launch})})
    return kernels


@pytest.mark.parametrize("rows_per_chunk", [device_pass.ROWS_PER_CHUNK, 1, 3])
@pytest.mark.parametrize("seed", range(12))
def test_gap_pass_matches_brute_force(seed, rows_per_chunk, monkeypatch):
    """Random kernels on two devices (tied starts and ends, untraced launches and threads), in a window that cuts
    some: each gap's row equals a sweep in (start, end) order, also read in chunks of one or three operations."""
    monkeypatch.setattr(device_pass, "ROWS_PER_CHUNK", rows_per_chunk)
    rng = random.Random(seed)
    kernels = random_kernels(rng)
    con = make_model(kernels=kernels, gpus=[{"device_id": 0}, {"device_id": 1}])
    start, end = rng.choice([(-10_000, 260_000), (20_000, 150_000)])
    scope = common.Scope(profile="t", devices=[0, 1], start_ns=start, end_ns=end, duration_ns=end - start,
                         window_basis="capture")
    got, want = gaps(con, scope), brute_force(kernels, scope)
    assert [g[:7] for g in got] == [w for w, _, _ in want]
    assert all(g[7:9] in threads and g[9:] in prevs for g, (_, threads, prevs) in zip(got, want, strict=True))
    assert any(g[9] is not None for g in got) or not any(p != {(None, None)} for _, _, p in want)


@pytest.mark.parametrize("stem", [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"][:4])
def test_gap_pass_chunked_attribution_equals_one_pass(open_fixture, stem, monkeypatch):
    """The attribution over gaps found in chunks of 97 operations equals the one found in one chunk."""
    con = open_fixture(stem).con
    scope = common.resolve_scope(con, common.ScopedParams(profile="t"), default="gpu_active")
    monkeypatch.setattr(common, "_model_cache", {})
    whole = attribution.attribute(con, scope)
    monkeypatch.setattr(common, "_model_cache", {})
    monkeypatch.setattr(device_pass, "ROWS_PER_CHUNK", 97)
    assert attribution.attribute(con, scope) == whole


@pytest.mark.parametrize("stem", [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"][:4])
def test_gap_pass_folded_queued_gaps_leave_the_attribution_unchanged(open_fixture, stem, monkeypatch):
    """The short queued gaps the pass only counts give the same attribution as rows of their own."""
    con = open_fixture(stem).con
    scope = common.resolve_scope(con, common.ScopedParams(profile="t"), default="gpu_active")
    monkeypatch.setattr(common, "_model_cache", {})
    folded = attribution.attribute(con, scope)
    monkeypatch.setattr(common, "_model_cache", {})
    monkeypatch.setattr(attribution, "FOLD_BELOW_NS", 0)
    assert attribution.attribute(con, scope) == folded


def test_gap_pass_drops_its_tables_when_the_query_fails():
    con = make_model(kernels=random_kernels(random.Random(1)))
    scope = common.resolve_scope(con, common.ScopedParams(profile="t"), default="gpu_active")
    with pytest.raises(RuntimeError), gap_pass.idle_gaps(con, scope, TINY, 0):
        raise RuntimeError("the query failed")
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchone() == (0,)


@pytest.mark.parametrize("stem", [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"])
def test_gap_pass_device_figures_equal_the_device_pass_of_their_own(open_fixture, stem, monkeypatch):
    """The busy, per-slice, per-stream and per-kind unions the gap pass computes in passing (read by shares after an
    attribution) equal the device pass run alone, with chunks cut mid-device."""
    con = open_fixture(stem).con
    scope = common.resolve_scope(con, common.ScopedParams(profile="t"), default="gpu_active")
    monkeypatch.setattr(device_pass, "ROWS_PER_CHUNK", 97)
    monkeypatch.setattr(common, "_model_cache", {})
    alone = device_pass.device_passes(con, scope, attribution.DEVICE_PASS_SLICES)
    monkeypatch.setattr(common, "_model_cache", {})
    attribution.attribute(con, scope)
    monkeypatch.setattr(device_pass, "CHUNK_SQL", "SELECT error('the device pass ran again')")
    assert device_pass.device_passes(con, scope, attribution.DEVICE_PASS_SLICES) == alone
    assert sum(p.ops for p in alone.values()) > 0


@pytest.mark.parametrize(("later", "prev"), [
    ({"pid": None, "tid": None}, (1, 7)),  # an untraced operation ending together: the traced one still names it
    ({"pid": 1, "tid": 9}, (1, 9)),  # two traced ones ending together: the last in (start, end) order
    ({"pid": 1, "tid": 9, "end_ns": 90}, (1, 7)),  # the later one ends earlier: not where the gap begins
])
def test_gap_pass_names_the_thread_of_an_operation_ending_where_a_gap_begins(later, prev):
    kernels = [{"start_ns": 0, "end_ns": 100, "pid": 1, "tid": 7}, {"start_ns": 50, "end_ns": 100, **later},
               {"start_ns": 200, "end_ns": 300, "pid": None, "tid": None}]
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "correlation_id": n, "short_name": "k", "name": "k",
                               "category": "compute", **k} for n, k in enumerate(kernels)])
    scope = common.Scope(profile="t", devices=[0], start_ns=0, end_ns=300, duration_ns=300, window_basis="capture")
    assert [g[1:4] + g[7:] for g in gaps(con, scope)] == [(0, 100, 200, None, None, *prev)]


@pytest.mark.parametrize(("gap_ns", "written"), [(999, False), (1_000, True)])
def test_gap_pass_folds_only_queued_gaps_shorter_than_the_limit(gap_ns, written):
    """A gap whose next operation was launched before it began is only counted when shorter than fold_below_ns; one
    that long is written (the attribution lists gaps of at least its fold limit)."""
    kernels = [{"start_ns": 0, "end_ns": 100, "pid": 1, "tid": 7},
               {"start_ns": 100 + gap_ns, "end_ns": 2_000 + gap_ns, "pid": 1, "tid": 7, "launch_end_ns": 50}]
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "correlation_id": n, "short_name": "k", "name": "k",
                               "category": "compute", **k} for n, k in enumerate(kernels)])
    scope = common.Scope(profile="t", devices=[0], start_ns=0, end_ns=2_000 + gap_ns, duration_ns=2_000 + gap_ns,
                         window_basis="capture")
    with gap_pass.idle_gaps(con, scope, TINY, 1_000) as folded:
        rows = con.execute("SELECT start_ns, end_ns, launch_end_ns FROM idle_gaps").fetchall()
    assert (rows, folded.gaps, folded.ns) == (
        ([(100, 100 + gap_ns, 50)], {0: 0}, {0: 0}) if written else ([], {0: 1}, {0: gap_ns}))


@pytest.mark.parametrize(("launch_start", "run"), [
    (100, (0, 0, 100)),  # B's launch call had begun when the gap before it began: the run goes on through it
    (101, (200, 101, 0)),  # ... it began 1 ns after: that gap ends the run
])
def test_gap_pass_a_run_ends_only_at_a_gap_whose_launch_began_after_it(launch_start, run):
    """A runs 0-100, B 200-300 (its launch call returns at 150, after the gap before it began: not queued), C 400-500
    (launched at 350, after the gap before it began). The second gap's busy_from_ns is B's start either way (the
    unqueued gap before B), its run_from_ns, run_launch_ns and run_idle_ns depend on when B's launch call began."""
    kernels = [{"start_ns": 0, "end_ns": 100, "launch_start_ns": -50, "launch_end_ns": -10},
               {"start_ns": 200, "end_ns": 300, "launch_start_ns": launch_start, "launch_end_ns": 150},
               {"start_ns": 400, "end_ns": 500, "launch_start_ns": 350, "launch_end_ns": 360}]
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 7, "correlation_id": n,
                               "short_name": "k", "name": "k", "category": "compute", **k}
                              for n, k in enumerate(kernels)])
    scope = common.Scope(profile="t", devices=[0], start_ns=0, end_ns=500, duration_ns=500, window_basis="capture")
    with gap_pass.idle_gaps(con, scope, TINY, 0):
        rows = con.execute("""SELECT start_ns, busy_from_ns, run_from_ns, run_launch_ns, run_idle_ns FROM idle_gaps
                              ORDER BY start_ns""").fetchall()
    assert rows == [(100, 0, 0, 0, 0), (300, 200, *run)]
