"""diff_profiles and verify_fix on the same work. Planted pairs made from two real nsys exports of C++ programs
(tests/planted_exports.py): extrap's concurrent kernels (no steps: totals of the work are compared) and our H100
capture sync_alloc (300 NVTX 'iteration' steps: per step), each with the whole timeline stretched by 1.25, the kernels
alone by 1.3, the host's own time between launches doubled, and every kernel run twice; each pair's verdict and the
figure that decided it are checked against the raw exports read with sqlite3, with verify_fix's answer. Then real
pairs captured on an H100 (corpus/captures), checked against their raw JSON or SQLite: a fix of the same work, the
same kernels launched as a CUDA graph, and different kernels (fp32 vs bf16 GEMMs)."""

from __future__ import annotations

import gzip
import itertools
import json
import sqlite3
import statistics
from collections import Counter
from pathlib import Path

import pytest
from conftest import FIXTURES
from planted_exports import duplicate_kernels, planted, slow_host, stretch_all, stretch_kernels

from corpus import sources
from stallhound.cli.main import main
from stallhound.formats import open_profile
from stallhound.tools import diff_profiles as dp
from stallhound.tools import verify_fix as vf
from stallhound.tools.diff.side import Side, measure

CAPTURES = {p.name: p for p in sources.load() if p.origin == "capture"}
EXTRAP = FIXTURES / "extrap_windows_con_kernel.sqlite"
CHANGES = {"stretched": stretch_all(1.25), "slower_kernels": stretch_kernels(1.3), "slower_host": slow_host(2.0),
           "more_work": duplicate_kernels()}
SYNC_CALLS = "%Synchroniz%"  # the synchronizing CUDA runtime calls, as nsys names them


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    """'extrap', 'sync_alloc' and '<base>/<change>' -> the raw export, planted once per module."""
    folder = tmp_path_factory.mktemp("planted")
    sync_alloc = sources.resolve(CAPTURES["sync_alloc"], folder)
    assert sync_alloc is not None, "a committed capture is always here"
    out = {"extrap": EXTRAP, "sync_alloc": sync_alloc}
    for base in ("extrap", "sync_alloc"):
        for name, change in CHANGES.items():
            out[f"{base}/{name}"] = planted(out[base], folder / f"{base}-{name}.sqlite", change)
    return out


@pytest.fixture(scope="module")
def sides(paths, cache_root):
    """sides(key) -> the diff Side of a profile (a planted key or a capture's name), measured once per module."""
    opened, measured = [], {}

    def side(key: str) -> Side:
        if key not in measured:
            path = paths.get(key) or sources.resolve(CAPTURES[key], cache_root)
            opened.append(open_profile(path, cache_dir=cache_root))
            measured[key] = measure(opened[-1].con, key)
        return measured[key]

    yield side
    for profile in opened:
        profile.close()


def _diff(sides, before: str, after: str) -> dp.Result:
    return dp.compare(sides(before), sides(after), dp.Params(before=before, after=after))


def _verify(sides, before: str, after: str, cause: str) -> vf.Result:
    return vf.compare(sides(before), sides(after), vf.Params(before=before, after=after, root_cause=cause))


# --- independent readings of the raw exports -------------------------------------------------------------------
def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def raw_span_ns(path: Path) -> int:
    """First GPU start to last GPU end over every kernel, copy and memset."""
    with _raw(path) as con:
        first, last = con.execute("SELECT min(s), max(e) FROM (" + " UNION ALL ".join(
            f'SELECT start AS s, "end" AS e FROM CUPTI_ACTIVITY_KIND_{t}' for t in ("KERNEL", "MEMCPY", "MEMSET"))
            + ")").fetchone()
    return last - first


def raw_host_ns(path: Path) -> int:
    """First kernel launch call's start to the last one's end, less the synchronizing calls inside (one thread)."""
    with _raw(path) as con:
        (lo, hi), = con.execute('SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IN '
                                "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)").fetchall()
        blocked = con.execute('SELECT sum(min(r."end", ?) - max(r.start, ?)) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN '
                              'StringIds s ON s.id = r.nameId WHERE s.value LIKE ? AND r.start < ? AND r."end" > ?',
                              (hi, lo, SYNC_CALLS, hi, lo)).fetchone()[0]
    return hi - lo - (blocked or 0)


def median_period(spans: list[tuple[float, float]]) -> float:
    """Median start-to-start period of ranges in time order, the last one to its own end."""
    starts = [s for s, _ in spans]
    return statistics.median([b - a for a, b in itertools.pairwise(starts)] + [spans[-1][1] - spans[-1][0]])


def raw_median_step_ns(path: Path, name: str) -> float:
    """median_period of the NVTX range `name`, the first one (warmup, outside the steady window) left out."""
    with _raw(path) as con:
        rows = con.execute('SELECT e.start, e."end" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId '
                           "WHERE coalesce(e.text, s.value) = ? ORDER BY 1", (name,)).fetchall()
    return median_period(rows[1:])


def raw_launches(path: Path, lo: int, hi: int, by_launch: bool) -> int:
    """Kernels whose launch call began in [lo, hi) (a window of steps, timed on the host; a planted copy shares its
    original's call), else whose GPU start is in it (a window timed on the GPU)."""
    placed = "coalesce(r.start, k.start)" if by_launch else "k.start"
    with _raw(path) as con:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                           f"USING (correlationId) WHERE {placed} >= ? AND {placed} < ?", (lo, hi)).fetchone()[0]


def raw_kernel_ns(path: Path, lo: int, hi: int) -> int:
    """Summed duration of the kernels whose launch call began in [lo, hi)."""
    with _raw(path) as con:
        return con.execute('SELECT sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN '
                           "CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId) WHERE r.start >= ? AND r.start < ?",
                           (lo, hi)).fetchone()[0]


# --- planted pairs --------------------------------------------------------------------------------------------
def test_diff_work_extrap_stretched_is_regressed_by_its_span(sides, paths):
    """No steps: the same 9 kernels over a GPU-active span 25% longer. Before: 'no clear change' (idle share per
    second, which a uniform stretch leaves alone)."""
    result = _diff(sides, "extrap", "extrap/stretched")
    d = result.decision
    assert (d.verdict, d.basis, d.figure, d.same_work) == ("regressed", "per_run", "gpu_active_span_ns", True)
    assert (d.before, d.after) == (raw_span_ns(paths["extrap"]), raw_span_ns(paths["extrap/stretched"]))
    assert d.change_pct == pytest.approx(25.0, abs=0.01)
    back = _diff(sides, "extrap/stretched", "extrap").decision
    assert (back.verdict, back.figure) == ("improved", "gpu_active_span_ns")
    assert back.change_pct == pytest.approx(-20.0, abs=0.01)


def test_diff_work_extrap_slower_kernels_and_slower_host_are_regressed(sides, paths):
    kernels = _diff(sides, "extrap", "extrap/slower_kernels").decision
    assert (kernels.verdict, kernels.figure) == ("regressed", "gpu_active_span_ns")
    assert kernels.after == raw_span_ns(paths["extrap/slower_kernels"])
    assert {c.figure: c.change_pct for c in kernels.compared}["kernel_time_ns"] == pytest.approx(30.0, abs=0.01)
    host = _diff(sides, "extrap", "extrap/slower_host").decision
    # one 250 ms kernel hides the host's 0.2 ms: the span stays, the host's own time decides
    assert (host.verdict, host.figure, host.same_work) == ("regressed", "host_time_ns", True)
    assert (host.before, host.after) == (raw_host_ns(paths["extrap"]), raw_host_ns(paths["extrap/slower_host"]))
    assert abs(host.compared[0].change_pct) < host.compared[0].threshold_pct  # the span, within its threshold


def test_diff_work_extrap_doubled_kernels_is_not_the_same_work(sides):
    d = _diff(sides, "extrap", "extrap/more_work").decision
    assert (d.verdict, d.basis, d.figure, d.same_work) == ("no clear change", "per_second", "idle_share_pct", False)
    assert d.matched_launches_pct == 50.0 and d.reason.startswith("not the same work: 50.0% of 9.0 and 18.0 launches")


def test_diff_work_sync_alloc_steps_stretched_or_slower_host_regress_by_the_step(sides, paths):
    median = raw_median_step_ns(paths["sync_alloc"], "iteration")
    stretched = _diff(sides, "sync_alloc", "sync_alloc/stretched").decision
    assert (stretched.verdict, stretched.basis, stretched.figure) == ("regressed", "per_iteration", "step_time_ns")
    assert stretched.before == pytest.approx(median, rel=0.02) and stretched.change_pct == pytest.approx(25.0, abs=0.01)
    # the slower host works between the iteration ranges, which keep their own spans: the host time decides
    host = _diff(sides, "sync_alloc", "sync_alloc/slower_host").decision
    assert (host.verdict, host.figure) == ("regressed", "host_time_ns") and host.change_pct > 50
    assert host.compared[0].figure == "step_time_ns" and host.compared[0].change_pct == 0


def test_diff_work_sync_alloc_slower_kernels_under_an_unchanged_host_regress_by_the_step(sides, paths):
    """30% slower kernels under an unchanged host: each iteration range, timed as the GPU ran it, takes 3.5% longer
    (the host's allocations pace the loop), and the step decides; the kernel time of the same launches shows the
    +30%. Before: 'no clear change', and --fail-on-regression 5 exited 0."""
    result = _diff(sides, "sync_alloc", "sync_alloc/slower_kernels")
    d, window = result.decision, result.before.window
    assert (d.verdict, d.basis, d.figure, d.same_work) == ("regressed", "per_iteration", "step_time_ns", True)
    assert d.before == pytest.approx(raw_median_step_ns(paths["sync_alloc"], "iteration"), rel=0.02)
    assert d.change_pct == pytest.approx(3.5, abs=0.1)
    kernel = next(c for c in d.compared if c.figure == "kernel_time_ns")  # per iteration, as the step
    raw = raw_kernel_ns(paths["sync_alloc"], window.start_ns, window.end_ns)
    assert kernel.before == pytest.approx(raw / result.before.iterations)
    assert kernel.change_pct == pytest.approx(30.0, abs=0.5)


def test_diff_work_sync_alloc_doubled_kernels_is_a_slower_step_of_other_work(sides, paths):
    """Every kernel run twice in a host-paced loop: each iteration launches two kernels where it launched one, and
    its step, the program's own unit of work, takes 10% longer: 'regressed' by the step, saying the work is not the
    same. Before: 'improved' from the idle share (85.9% -> 79.0%)."""
    result = _diff(sides, "sync_alloc", "sync_alloc/more_work")
    d = result.decision
    assert (d.verdict, d.basis, d.figure, d.same_work) == ("regressed", "per_iteration", "step_time_ns", False)
    assert d.before == pytest.approx(raw_median_step_ns(paths["sync_alloc"], "iteration"), rel=0.02)
    assert d.change_pct == pytest.approx(10.0, abs=0.2)
    launches = [raw_launches(paths[k], w.start_ns, w.end_ns, w.window_basis == "steady_state")
                for k, w in (("sync_alloc", result.before.window), ("sync_alloc/more_work", result.after.window))]
    assert launches[1] == 2 * launches[0]  # the after side's copies beside each kernel
    assert d.reason.startswith("not the same work: 50.0% of 1.0 and 2.0 launches per iteration match")
    assert "the step compared as the unit of work" in d.reason


def test_diff_work_steps_found_differently_are_no_unit(sides):
    """Steps from another kernel's rhythm (a kernel run twice a step halves them) are not a unit both share: the same
    work is then compared in total."""
    base = sides("sync_alloc")
    other = base.model_copy(update={"step_method": "kernel_pattern:relax"})
    d = dp.compare(base, other, dp.Params(before="a", after="b")).decision
    assert (d.verdict, d.basis, d.figure, d.same_work) == ("no clear change", "per_run", "gpu_active_span_ns", True)


def test_diff_work_cli_fails_on_a_regression_hidden_from_the_step(paths, cache_root, capsys):
    args = ["diff", str(paths["sync_alloc"]), str(paths["sync_alloc/slower_kernels"]), "--cache-dir", str(cache_root)]
    assert main([*args, "--fail-on-regression", "3"]) == 1  # the deciding span grew 4.0%
    assert capsys.readouterr().out.startswith("verdict: regressed: the same work")
    assert main([*args, "--fail-on-regression", "40"]) == 0


@pytest.mark.parametrize(("before", "after", "cause", "answer"), [
    ("extrap", "extrap/stretched", "excessive-synchronization", "fail"),  # before: unclear (calls per second fell)
    ("extrap/stretched", "extrap", "kernel-hotspot", "pass"),
    ("extrap", "extrap/slower_kernels", "kernel-hotspot", "fail"),
    ("extrap", "extrap/slower_host", "excessive-synchronization", "fail"),
    ("extrap", "extrap/more_work", "excessive-synchronization", "unclear"),
    ("sync_alloc", "sync_alloc/stretched", "blocking-d2h-sync", "fail"),
    ("sync_alloc/stretched", "sync_alloc", "blocking-d2h-sync", "pass"),
    ("sync_alloc", "sync_alloc/slower_kernels", "blocking-d2h-sync", "fail"),  # before: a false pass
    ("sync_alloc", "sync_alloc/slower_host", "alloc-in-loop", "fail"),
    ("sync_alloc", "sync_alloc/more_work", "alloc-in-loop", "fail"),  # the same allocation idle, a slower step
])
def test_diff_work_verify_fix_on_each_planted_pair(sides, before, after, cause, answer):
    result = _verify(sides, before, after, cause)
    assert result.answer == answer, result.reason


def test_diff_work_verify_fix_reads_sync_totals_of_the_same_work(sides):
    """The same sync calls, 25% longer: totals, not 'calls per second -20%'."""
    checks = {c.figure: c for c in _verify(sides, "extrap", "extrap/stretched", "excessive-synchronization").checks}
    calls, blocked = checks["sync calls"], checks["sync blocked"]
    assert (calls.unit, calls.before, calls.after, calls.moved) == ("calls", 3.0, 3.0, "unchanged")
    assert (blocked.unit, blocked.moved, blocked.change_pct) == ("ns", "wrong way", pytest.approx(25.0, abs=0.01))


# --- real pairs captured on an H100 ---------------------------------------------------------------------------
def _trace(name: str) -> list[dict]:
    with gzip.open(sources.stored(CAPTURES[name])) as f:
        return json.load(f)["traceEvents"]


def raw_profiler_steps(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) in us of torch.profiler's step ranges on the host, in time order."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))


def raw_launches_per_step(events: list[dict]) -> Counter[str]:
    """Kernel launches per step by name: kernels whose launch call (runtime or driver API) began inside the steps."""
    steps = raw_profiler_steps(events)
    calls = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    launched = Counter(e["name"] for e in events if e.get("cat") == "kernel" and
                       steps[0][0] <= calls.get(e["args"]["correlation"], -1) < steps[-1][1])
    return Counter({name: n / len(steps) for name, n in launched.items()})


def raw_matched_pct(before: list[dict], after: list[dict]) -> float:
    b, a = raw_launches_per_step(before), raw_launches_per_step(after)
    return round(100 * sum(min(n, a[k]) for k, n in b.items()) / max(b.total(), a.total()), 2)


def test_diff_work_real_sync_fix_of_the_same_work_is_improved_by_the_step(sides):
    """sync_pageable_fixed: the same kernels (one more a step: the loss summed on the device), pinned batches and no
    sync a step. Before: 'no clear change' (mean steps with a 7.9 ms warmup and a 6.9 ms last step: threshold 14.9%)."""
    before, after = _trace("sync_pageable"), _trace("sync_pageable_fixed")
    d = _diff(sides, "sync_pageable", "sync_pageable_fixed").decision
    assert (d.verdict, d.figure, d.same_work) == ("improved", "step_time_ns", True)
    assert d.matched_launches_pct == raw_matched_pct(before, after) == 97.78
    for side, events in ((d.before, before), (d.after, after)):  # every step is in the window: no warmup outlier
        assert side == pytest.approx(1000 * median_period(raw_profiler_steps(events)), rel=0.02)


def test_diff_work_real_sync_fix_under_nsys_is_improved_by_the_step(sides):
    d = _diff(sides, "sync_pageable_nsys", "sync_pageable_fixed_nsys").decision
    assert (d.verdict, d.figure, d.same_work) == ("improved", "step_time_ns", True)
    for side, name in ((d.before, "sync_pageable_nsys"), (d.after, "sync_pageable_fixed_nsys")):
        assert side == pytest.approx(raw_median_step_ns(sources.resolve(CAPTURES[name]), "train_step"), rel=0.02)


def test_diff_work_real_cuda_graph_runs_the_same_kernels_faster(sides):
    before, after = _trace("launch_bound"), _trace("launch_bound_graph")
    assert raw_launches_per_step(before) == raw_launches_per_step(after) and raw_launches_per_step(after).total() == 480
    d = _diff(sides, "launch_bound", "launch_bound_graph").decision
    assert (d.verdict, d.figure, d.same_work, d.matched_launches_pct) == ("improved", "step_time_ns", True, 100.0)
    assert d.warnings == []  # windows 20x apart are the same steps, faster


def test_diff_work_real_fp32_vs_bf16_is_not_the_same_work(sides):
    fp32, bf16 = _trace("gemm_fp32"), _trace("gemm_bf16")
    d = _diff(sides, "gemm_fp32", "gemm_bf16").decision
    assert not d.same_work and d.matched_launches_pct == raw_matched_pct(fp32, bf16) == 0.0
    assert "not the same work" in d.work_note and "not the same work" in d.reason
