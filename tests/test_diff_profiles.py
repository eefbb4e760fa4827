"""diff_profiles: a real before/after pair checked against SQL on the raw exports, synthetic pairs with one planted
change of known size, a profile against itself, the warnings, the markdown, the CLI and the MCP tool."""

from __future__ import annotations

import itertools
import sqlite3
import statistics

import pytest
from conftest import FIXTURE_IDS, FIXTURES, SYNTH_PAIRS, lived_iterations
from mcp.client import Client

from stallhound.cli.main import main
from stallhound.server import budget
from stallhound.server.app import build_server
from stallhound.tools import diff_profiles as dp

BEFORE, AFTER = FIXTURES / "nsysai_mfu_2gpu_before.sqlite", FIXTURES / "nsysai_mfu_2gpu_after.sqlite"
STEP_RANGE = "FSDP::pre_forward (blocks.%._checkpoint_wrapped_module)%"  # the FSDP step marker in the real pair


@pytest.fixture(scope="module")
def real(open_fixture) -> dp.Result:
    before, after = open_fixture(BEFORE.stem), open_fixture(AFTER.stem)
    return dp.run(before.con, after.con, dp.Params(before="before", after="after"))


def _raw(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _raw_step_ns(path) -> float:
    """Median start-to-start period of the step marker per thread, averaged over threads, from the raw export."""
    with _raw(path) as con:
        rows = con.execute("SELECT e.globalTid, e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                           "WHERE coalesce(e.text, s.value) LIKE ? ORDER BY 1, 2", (STEP_RANGE,)).fetchall()
    starts: dict[int, list[int]] = {}
    for tid, start in rows:
        starts.setdefault(tid, []).append(start)
    return statistics.fmean(statistics.median(b - a for a, b in itertools.pairwise(s)) for s in starts.values())


def _raw_busy_ns(path, start: int, end: int) -> int:
    """Union of kernels, copies and memsets per device inside [start, end), summed over devices, from the raw export."""
    with _raw(path) as con:
        rows = con.execute(" UNION ALL ".join(
            f"SELECT deviceId, max(start, {start}), min(end, {end}) FROM {t} WHERE end > {start} AND start < {end}"
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
            + " ORDER BY 1, 2").fetchall()
    busy, device, reach = 0, None, 0
    for dev, lo, hi in rows:
        if dev != device:
            device, reach = dev, lo
        busy += max(0, hi - max(lo, reach))
        reach = max(reach, hi)
    return busy


def _figure(result: dp.Result, name: str) -> dp.FigureRow:
    return next(r for r in result.figures if r.figure == name)


def test_diff_profiles_real_pair_step_time_and_busy_match_sql_on_the_exports(real):
    step = _figure(real, "step time")
    raw_before, raw_after = _raw_step_ns(BEFORE), _raw_step_ns(AFTER)
    assert step.before == pytest.approx(raw_before, rel=0.02)
    assert step.after == pytest.approx(raw_after, rel=0.02)
    assert real.decision.change_pct == pytest.approx(100 * (raw_after / raw_before - 1), abs=2.0)
    busy = _figure(real, "GPU busy")
    for path, side, value in ((BEFORE, real.before, busy.before), (AFTER, real.after, busy.after)):
        scope = side.window
        assert value == pytest.approx(_raw_busy_ns(path, scope.start_ns, scope.end_ns) / side.iterations, rel=0.005)


def test_diff_profiles_real_pair_is_a_regression_from_launch_bound_idle(real):
    """What an expert reads in the pair: the same work (the same kernels, launch counts within 1%), about 16% slower
    per step (median), beyond the iteration noise; the GPUs idle twice as long because launches got slower (launch API
    time up ~40%, tiny kernel count unchanged), and the small-kernel-overhead finding grew while NCCL on the compute
    stream got worse too."""
    d = real.decision
    assert (d.verdict, d.basis, d.figure, d.same_work) == ("regressed", "per_iteration", "step_time_ns", True)
    assert d.matched_launches_pct > 99 and 14 < d.change_pct < 19 and d.threshold_pct < d.change_pct
    assert d.noise_before_pct > 0 and d.noise_after_pct > 0 and d.warnings == []
    assert real.before.iterations == 16 and real.after.iterations == 14
    assert _figure(real, "GPU idle").change_pct > 50
    assert _figure(real, "launch API").change_pct > 30
    assert abs(_figure(real, "tiny kernels").change_pct) < 5
    status = {f.root_cause: f.status for f in real.findings}
    assert status["small-kernel-overhead"] == "bigger" and status["nccl-on-compute-stream"] == "bigger"
    assert real.findings[0].root_cause == "small-kernel-overhead"
    assert [k.status for k in real.kernels if k.name == "ncclDevKernel_SendRecv"] == ["slower"]


def test_diff_profiles_profile_with_itself_says_no_change(open_fixture):
    before = open_fixture(BEFORE.stem)
    result = dp.run(before.con, before.con, dp.Params(before="a", after="a"))
    assert result.decision.verdict == "no clear change" and result.decision.change_pct == 0
    assert all(r.change_pct in (0, None) for r in result.figures + result.devices)
    assert {k.status for k in result.kernels} == {"same"} and {f.status for f in result.findings} == {"same"}
    assert result.decision.warnings == []


PER_RUN = {"extrap_windows_con_kernel", "fuser_h200_crossentropy", "nsysai_mock"}  # no steady iterations
NO_KERNELS = {"dynamicvit_empty_export"}  # no work to match: per second


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_diff_profiles_every_fixture_with_itself_says_no_change_within_budget(open_fixture, stem):
    profile = open_fixture(stem)
    params = dp.Params(before="a", after="a")
    text, result = budget.fit(dp.run(profile.con, profile.con, params), dp, params, budget.MAX_RESULT_CHARS)
    assert result.decision.verdict == "no clear change" and result.cut_by in (None, "limit")
    assert result.basis == ("per_second" if stem in NO_KERNELS else "per_run" if stem in PER_RUN else "per_iteration")
    assert result.decision.same_work == (stem not in NO_KERNELS)
    assert len(text) < 5_000


EXPECTED = {  # pair -> (verdict, root cause, its status)
    "removed_sync": ("improved", "excessive-synchronization", "gone"),
    "pinned_memory": ("improved", "pageable-host-memory", "gone"),
    "fewer_tiny_kernels": ("improved", "small-kernel-overhead", "gone"),
    "slower_rank": ("regressed", "nccl-straggler", "new"),
}


def _truth_step_ns(truth: dict) -> float:
    """Mean planted step (the iterations as the devices lived them), the first (warmup) left out."""
    return statistics.fmean(e - s for s, e in lived_iterations(truth)[1:])


@pytest.mark.parametrize("name", sorted(SYNTH_PAIRS))
def test_diff_profiles_synth_pair_gives_the_planted_verdict_and_finding(synth_pair, name):
    (before, truth_b), (after, truth_a) = synth_pair(name)
    result = dp.run(before.con, after.con, dp.Params(before="b", after="a"))
    verdict, cause, status = EXPECTED[name]
    assert result.decision.verdict == verdict, result.decision.reason
    assert {f.root_cause: f.status for f in result.findings}.get(cause) == status
    planted = _truth_step_ns(truth_a) - _truth_step_ns(truth_b)
    step = _figure(result, "step time")
    assert step.after - step.before == pytest.approx(planted, rel=0.1)
    assert result.decision.warnings == []


def test_diff_profiles_warns_when_runs_are_not_comparable(open_fixture, synth_pair, tmp_path, cache_root):
    from stallhound import synth
    from stallhound.formats import open_profile
    (clean, _), _ = synth_pair("slower_rank")
    other = dp.run(open_fixture(BEFORE.stem).con, clean.con, dp.Params(before="real", after="synth"))
    assert any(w.startswith("different programs: only") for w in other.decision.warnings), other.decision.warnings
    empty = dp.run(clean.con, open_fixture("dynamicvit_empty_export").con, dp.Params(before="synth", after="empty"))
    assert empty.decision.verdict == "no clear change"
    assert any("has no GPU work" in w for w in empty.decision.warnings)
    path = tmp_path / "long4.sqlite"
    synth.write_sample(path, synth.SynthConfig(devices=4, iterations=40))
    long = open_profile(path, cache_dir=cache_root)
    try:
        apart = dp.run(clean.con, long.con, dp.Params(before="short", after="long"))
    finally:
        long.close()
    warned = " ".join(apart.decision.warnings)
    assert "different GPUs" in warned and "windows of very different length" in warned


def test_diff_profiles_markdown_snapshot(real, snapshot):
    assert dp.render_markdown(real) == snapshot


def test_diff_profiles_default_output_is_bounded_and_limit_gives_more(real, open_fixture):
    text = dp.render(real)
    assert len(text) < 5_000 and len(real.kernels) == dp.DEFAULT_KERNEL_ROWS and real.truncated
    before, after = open_fixture(BEFORE.stem), open_fixture(AFTER.stem)
    params = dp.Params(before="b", after="a", limit=100)
    text, more = budget.fit(dp.run(before.con, after.con, params), dp, params, None)
    assert len(more.kernels) == more.total_kernels == real.total_kernels > dp.DEFAULT_KERNEL_ROWS
    assert more.cut_by is None and not more.truncated
    text, cut = budget.fit(real, dp, dp.Params(before="b", after="a"), None)
    assert cut.cut_by == "limit" and "raise `limit`" in cut.cut_note


def test_diff_profiles_cli_formats_and_fails_on_regression(cache_root, capsys):
    args = ["diff", str(BEFORE), str(AFTER), "--cache-dir", str(cache_root)]
    assert main([*args, "--fail-on-regression", "10"]) == 1
    assert capsys.readouterr().out.startswith("verdict: regressed")
    assert main([*args, "--fail-on-regression", "20", "--format", "markdown"]) == 0
    assert capsys.readouterr().out.startswith("## stallhound diff")
    assert main([*args, "--format", "json", "--limit", "2"]) == 0
    assert '"verdict": "regressed"' in capsys.readouterr().out
    assert main([*args, "--fail-on-regression", "-1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1



@pytest.mark.anyio
async def test_diff_profiles_through_an_mcp_client(cache_root):
    server = build_server([FIXTURES], cache_dir=cache_root)
    async with Client(server) as client:
        loaded = await client.call_tool("load_profile", {"path": str(BEFORE)})
        result = await client.call_tool("diff_profiles", {"before": loaded.structured_content["profile"],
                                                          "after": str(AFTER)})
        assert not result.is_error
        assert result.structured_content["decision"]["verdict"] == "regressed"
        assert result.structured_content["after"]["profile"] == AFTER.stem
        assert result.content[0].text.startswith("verdict: regressed")
        missing = await client.call_tool("diff_profiles", {"before": "nope", "after": str(AFTER)})
        assert missing.is_error and "no profile is loaded with id 'nope'" in missing.content[0].text
        assert "\n" not in missing.content[0].text
        wrong = await client.call_tool("diff_profiles", {"before": str(BEFORE), "after": str(AFTER), "limit": "10"})
        assert wrong.is_error and "limit" in wrong.content[0].text and "\n" not in wrong.content[0].text
        itself = await client.call_tool("diff_profiles", {"before": str(BEFORE), "after": BEFORE.stem})
        assert itself.structured_content["decision"]["verdict"] == "no clear change"
        listed = await client.call_tool("list_profiles", {})
        assert {p["profile"] for p in listed.structured_content["profiles"]} == {BEFORE.stem, AFTER.stem}
