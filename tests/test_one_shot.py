"""one_shot: a program that repeats nothing has no warmup to leave out; its setup is its start-up cost (book
profiler-window-on-warmup, tag one-shot). Ranking: a kernel that holds most of the window ranks as a tenth of the
window at stake would (hotspots.ranked, common.leads_first)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest
from modeldb import make_model

from corpus import sources
from stallhound import book
from stallhound.analysis import hotspots, idle_causes, one_shot
from stallhound.analysis.attribution import CauseTime, DeviceIdle
from stallhound.analysis.common import Finding, ScopedParams, leads_first, resolve_scope
from stallhound.analysis.idle_causes import Seen
from stallhound.analysis.one_shot import ONE_SHOT, Fragment, OneShot
from stallhound.analysis.program import FIX_CHAINS, Program
from stallhound.formats import open_profile
from stallhound.tools import triage

MS = 1_000_000
WINDOW = 100 * MS
WARMUP_FIX = "after the warmup iterations"


def prog(kind: str) -> Program:
    return Program(kind=kind, fix_chain=list(FIX_CHAINS[kind]), frameworks=[], process="p", evidence=[],
                   decided_by="test")


@pytest.mark.parametrize("once, tags, words", [
    (OneShot(kernels=2, names=2, most_runs=1), ["setup", ONE_SHOT], "(2 kernels, each run once; no steps)"),
    (OneShot(kernels=5, names=3, most_runs=2), ["setup", ONE_SHOT],
     "(5 kernels of 3 names, none run more than 2 times; no steps)"),
    (None, ["setup"], "not in a loop: a window over the steady state leaves it out"),
    (Fragment(first_id=538_860, calls=8), ["setup"], "the capture is a fragment of a longer run (its first CUDA call "
     "has correlation id 538,860, and 8 calls recorded: the process made CUDA calls before the capture began), so "
     "this is not the program's start-up"),
])
def test_setup_in_a_program_that_repeats_nothing_is_its_start_up(once, tags, words):
    d = DeviceIdle(device=0, window_ns=WINDOW, idle_ns=40 * MS, causes={"jit": CauseTime(30 * MS, 1, long_ns=30 * MS)})
    seen = Seen(one_shot={0: once} if once else {})
    (f,) = idle_causes.findings({0: d}, prog("cuda"), seen=seen)
    assert (f.root_cause, f.time_at_stake_ns, f.tags) == ("profiler-window-on-warmup", 30 * MS, tags)
    assert words in f.title


@pytest.mark.parametrize("kind", sorted(FIX_CHAINS))
def test_one_shot_fix_never_asks_for_iterations_the_program_lacks(kind):
    entry = book.get_entry("profiler-window-on-warmup")
    fix = entry.fix_for(tuple(FIX_CHAINS[kind]), ["setup", ONE_SHOT])
    plain = entry.fix_for(tuple(FIX_CHAINS[kind]), ["setup"])
    assert fix.when == ONE_SHOT and "once" in fix.text and "paid again" in fix.text
    assert WARMUP_FIX not in fix.text and fix.text != plain.text


def kernel(name: str, start_ms: int) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "start_ns": start_ms * MS,
            "end_ns": start_ms * MS + MS, "launch_start_ns": start_ms * MS, "short_name": name, "name": name}


@pytest.mark.parametrize("starts, expected", [
    ({"a": [0], "b": [5]}, {0: OneShot(2, 2, 1)}),
    ({"a": [0, 10], "b": [5]}, {0: OneShot(3, 2, 2)}),  # twice is no period
    ({"a": [0, 10, 20], "b": [5]}, {}),  # three runs of a, one every 10 ms: steps
    ({"a": [0, 10, 50], "b": [5]}, {}),  # three runs of a, no period (no steps): still not once
])
def test_one_shot_devices_by_their_kernels_runs(starts, expected):
    con = make_model(kernels=[kernel(n, s) for n, ss in starts.items() for s in ss])
    assert one_shot.on_devices(con, resolve_scope(con, ScopedParams(profile="p"), "gpu_active")) == expected


@pytest.mark.parametrize("first, last, expected", [
    (10_001, 10_002, Fragment(10_001, 2)),  # 10,000 ids before the first call (FRAGMENT_MIN_PRIOR_IDS): mid-run
    (10_000, 10_001, OneShot(2, 2, 1)),  # 9,999 before it: a start-up's calls can take that many
    (20_001, 20_200, Fragment(20_001, 2)),  # 20,000 before ids spanning 200: a hundred times (FRAGMENT_PRIOR_RATIO)
    (20_001, 20_201, OneShot(2, 2, 1)),  # spanning 201: a long capture may begin that late in a whole run
])
def test_a_capture_whose_first_call_has_a_high_correlation_id_is_a_fragment(first, last, expected):
    calls = [{"pid": 1, "tid": 1, "name": "cudaLaunchKernel", "kind": "launch", "start_ns": s * MS,
              "end_ns": s * MS + 1000, "correlation_id": i} for i, s in ((first, 0), (last, 5))]
    kernels = [{**kernel(n, s), "correlation_id": i} for i, (n, s) in ((first, ("a", 0)), (last, ("b", 5)))]
    con = make_model(kernels=kernels, cuda_api=calls)
    assert one_shot.on_devices(con, resolve_scope(con, ScopedParams(profile="p"), "gpu_active")) == {0: expected}


def test_a_program_that_marks_its_steps_is_not_one_shot():
    """Two kernels once each, but inside two ranges named as steps (step_boundaries.EXPLICIT_STEP): a loop."""
    steps = [{"pid": 1, "tid": 1, "text": "train_step", "start_ns": s * MS, "end_ns": s * MS + 4 * MS,
              "kind": "push_pop", "depth": 0} for s in (0, 5)]
    calls = [{"pid": 1, "tid": 1, "name": "cudaLaunchKernel", "kind": "launch", "start_ns": s * MS,
              "end_ns": s * MS + 1000, "correlation_id": i} for i, s in enumerate((0, 5))]
    kernels = [{**kernel(n, s), "correlation_id": i} for i, (n, s) in enumerate((("a", 0), ("b", 5)))]
    con = make_model(kernels=kernels, nvtx=steps, cuda_api=calls)
    assert one_shot.on_devices(con, resolve_scope(con, ScopedParams(profile="p"), "gpu_active")) == {}


def hot(window_pct: float, stake_ns: int = 0) -> Finding:
    return Finding(root_cause="kernel-hotspot", severity="medium", title="k", time_at_stake_ns=stake_ns, device=0,
                   evidence=hotspots.ranked(window_pct, WINDOW), tags=[])


def cost(root: str, stake_ns: int, severity: str = "medium") -> Finding:
    return Finding(root_cause=root, severity=severity, title=root, time_at_stake_ns=stake_ns, device=0, evidence={},
                   tags=[])


@pytest.mark.parametrize("found, order", [
    # a kernel holding most of the window ranks above costs under a tenth of it, below those of a tenth or more
    ([cost("setup", 4 * MS), hot(94.5)], ["kernel-hotspot", "setup"]),
    ([cost("sync", 10 * MS, "high"), hot(94.5)], ["sync", "kernel-hotspot"]),
    ([cost("setup", 4 * MS), hot(49.9)], ["setup", "kernel-hotspot"]),  # not most of the window: by its stake
    ([cost("sync", 30 * MS, "high"), hot(97.0, 40 * MS)], ["kernel-hotspot", "sync"]),  # a larger bound counts
])
def test_a_kernel_that_is_most_of_the_window_leads_smaller_costs(found, order):
    assert [f.root_cause for f in leads_first(found, lambda f: f, 10)] == order


# --- real profiles of the corpus --------------------------------------------------------------------------
CORPUS = {p.name: p for p in sources.load()}


def corpus(name: str) -> Path:
    path = sources.resolve(CORPUS[name])
    if path is None:
        pytest.skip(f"corpus profile {name} is not restored in {sources.cache_dir()} (make corpus-restore)")
    return path


def raw_kernels(path: Path) -> tuple[int, int, int]:
    """Independent reading: kernels, names and the most runs of one name; no NVTX range text occurs twice."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    if con.execute("SELECT name FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchall():
        assert con.execute("SELECT max(n) FROM (SELECT count(*) n FROM NVTX_EVENTS GROUP BY text)").fetchone() == (1,)
    return con.execute("""SELECT count(*), count(DISTINCT shortName), max(n) FROM CUPTI_ACTIVITY_KIND_KERNEL
        JOIN (SELECT shortName s, count(*) n FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY shortName) ON s = shortName"""
                       ).fetchone()


@pytest.mark.parametrize("name, raw, first", [
    # SQL: init_rng and simulate_random_play_kernel, once each; the 110.014 ms kernel is 94.5% of the 116.463 ms span
    ("mcts2048_one_kernel_rtx3080", (2, 2, 1), "kernel-hotspot"),
    # SQL: function_11_gpu once (0.092 ms), three copies, one NVTX range (MyFunction): the setup is all there is
    ("miniproj_acc_forloop_gtx1060", (1, 1, 1), "profiler-window-on-warmup"),
])
def test_one_shot_exports_get_a_start_up_fix(name, raw, first, cache_root):
    path = corpus(name)
    assert raw_kernels(path) == raw
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile=name))
    finally:
        profile.close()
    assert result.findings[0].root_cause == first
    (setup,) = [f for f in result.findings if f.root_cause == "profiler-window-on-warmup"]
    assert ONE_SHOT in setup.tags and WARMUP_FIX not in setup.fix and "start-up cost" in setup.fix
    assert f"({raw[0]} kernel" in setup.title


def raw_kineto_calls(path: Path) -> tuple[int, int, int, int]:
    """Independent reading of a Kineto JSON: the CUDA runtime calls' smallest correlation id and their count, and of
    the longest launch call, its length and how far into it its kernel began (us)."""
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    calls = [e for e in events if e.get("cat") == "Runtime"]
    kernels = {e["args"]["correlation"]: e for e in events if e.get("cat") == "Kernel"}
    longest = max((e for e in calls if e["name"] == "cudaLaunchKernel"), key=lambda e: e["dur"])
    return (min(e["args"]["correlation"] for e in calls), len(calls), longest["dur"],
            kernels[longest["args"]["correlation"]]["ts"] - longest["ts"])


def test_a_fragment_of_a_long_run_is_no_start_up_and_its_long_launch_no_load(cache_root):
    """hta_old_format_inference_rank1: 4 kernels, none run 3 times, no steps, but its first call has correlation id
    538,860 with 8 calls recorded (a fragment); its 1.414 ms cudaLaunchKernel began its kernel 12 us in (submitted,
    then host time: no lazy load)."""
    name = "hta_old_format_inference_rank1"
    path = corpus(name)
    assert raw_kineto_calls(path) == (538_860, 8, 1_414, 12)
    profile = open_profile(path, cache_dir=cache_root)
    try:
        scope = resolve_scope(profile.con, ScopedParams(profile=name), "gpu_active")
        assert one_shot.on_devices(profile.con, scope) == {0: Fragment(538_860, 8)}
        result = triage.run(profile.con, triage.Params(profile=name))
    finally:
        profile.close()
    roots = {f.root_cause for f in result.findings}
    assert not roots & {"profiler-window-on-warmup", "module-loading-hot-path",
                         "torch-compile-recompilation"}
