"""triage and answer_questions: planted problems found and ranked, clean sample quiet, book ids resolve,
answers checked against independent SQL on the raw export."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, planted
from modeldb import make_model

from stallhound import book
from stallhound.analysis import rules
from stallhound.tools import answer_questions, triage

# planted kind -> the root cause triage must name for it
PLANTED_CAUSES = {
    "idle_gap": "gpu-bubbles",
    "gc_pause": "gc-pauses",
    "tiny_kernels": "small-kernel-overhead",
    "pageable_h2d": "pageable-host-memory",
    "small_d2h": "blocking-d2h-sync",
    "nccl_straggler": "nccl-straggler",
    "slow_first_iteration": "profiler-window-on-warmup",
}


@pytest.fixture(scope="module")
def demo_triage(demo):
    profile, truth = demo
    return triage.run(profile.con, triage.Params(profile="demo", limit=100)), truth


@pytest.mark.parametrize("kind, cause", sorted(PLANTED_CAUSES.items()))
def test_triage_finds_each_planted_problem(demo_triage, kind, cause):
    result, truth = demo_triage
    assert planted(truth, kind), f"the demo sample plants no {kind}"
    causes = {f.root_cause for f in result.findings}
    assert cause in causes, f"planted {kind} not reported as {cause} (found: {sorted(causes)})"


def test_triage_does_not_inflate_the_demos_cheap_device_syncs(demo_triage):
    """The demo's planted device syncs come after the optimizer's tiny kernels, which the host launches about as fast
    as they run: each waits some 25 us of queued work, and the host's 0.4-0.8 ms after it would idle the device with
    the sync gone too. They cost their own time, under 1% of the window: no excessive-synchronization finding (the
    removed_sync pair and test_sync_or_gc plant syncs that wait on a deep queue, and are found)."""
    result, truth = demo_triage
    assert planted(truth, "device_sync")
    assert "excessive-synchronization" not in {f.root_cause for f in result.findings}


def test_triage_names_the_straggler_device(demo_triage):
    result, truth = demo_triage
    [plant] = planted(truth, "nccl_straggler")
    waits = [f for f in result.findings if f.root_cause == "nccl-straggler"]
    assert waits and {f.evidence["late_device"] for f in waits} == {plant["device"]}
    assert {f.device for f in waits} <= set(plant["peer_devices"])  # the time at stake is the others' wait


def test_triage_tells_the_planted_idle_gaps_apart(demo_triage):
    """The gap with nothing traced on the host is a bubble; the one spent in poll() inside the data-loading
    range starves the device of input."""
    result, truth = demo_triage
    found = {(f.root_cause, f.device) for f in result.findings}
    for plant in planted(truth, "idle_gap"):
        cause = "gpu-bubbles" if plant["host_activity"] == "nothing traced" else "dataloader-starvation"
        assert (cause, plant["device"]) in found


def test_triage_analyses_the_steady_state_of_the_demo(demo_triage):
    result, truth = demo_triage
    last = truth["iterations"][-1]
    assert result.window.window_basis == "steady_state"
    second = truth["iterations"][1]  # the first is the planted warmup: left out
    assert second["start_ns"] <= result.window.start_ns < second["end_ns"]
    assert result.window.end_ns >= last["start_ns"]
    assert result.program.kind == "pytorch" and all(f.fix_for in ("pytorch", "python", "generic")
                                                    for f in result.findings)


MS = 1_000_000


def irregular_loop(setup_ms: int, name: str = "step", compile_ms: int = 0):
    """A kernel, `setup_ms` of nothing (the last `compile_ms` of it in cuModuleLoadData), then 6 NVTX ranges
    `name k` alternating 4 and 1 ms (p90/p10 = 4), three 0.1 ms kernels each."""
    starts, t = [], (setup_ms + 1) * MS
    for k in range(6):
        starts.append(t)
        t += (1 if k % 2 else 4) * MS
    ranges = [{"pid": 1, "tid": 1, "text": f"{name} {k}", "start_ns": s, "end_ns": e, "kind": "push_pop", "depth": 0}
              for k, (s, e) in enumerate(zip(starts, [*starts[1:], t], strict=True))]
    kernels = [{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "start_ns": s + i * MS // 5,
                "end_ns": s + i * MS // 5 + MS // 10, "short_name": "k", "name": "k", "launch_start_ns": s}
               for s in [0, *starts] for i in range(3)]
    loads = [{"pid": 1, "tid": 1, "name": "cuModuleLoadData", "kind": "module", "start_ns": starts[0] - compile_ms * MS,
              "end_ns": starts[0]}] if compile_ms else []
    return make_model(nvtx=ranges, kernels=kernels, cuda_api=loads), starts


@pytest.mark.parametrize("setup_ms, name, loop_window", [
    (100, "step", True),
    (5, "step", False),  # the steps span longer than the setup: no reason to leave the setup out
    (100, "phase", False),  # irregular ranges not named like steps may not be the loop at all
])
def test_triage_irregular_loop_is_the_window_only_after_a_longer_setup(setup_ms, name, loop_window):
    """Irregular steps are no steady state, but when more GPU-active time precedes them than they span (a capture
    from launch that compiles for seconds), a window over both would describe the setup."""
    con, starts = irregular_loop(setup_ms, name)
    result = triage.run(con, triage.Params(profile="t"))
    if loop_window:
        # the first step, 4x the median, is the warmup left out; the last, under half the median period, is a
        # step cut off by the capture (tools/iterations.py)
        assert (result.window.start_ns, result.window.end_ns, result.window.window_basis) == (
            starts[1], starts[-1], "steady_state")
        assert result.window_note.startswith("the loop (steps irregular, p90/p10 = 4.0")
    else:
        assert (result.window.start_ns, result.window.window_basis) == (0, "gpu_active")
        assert "vary widely" in result.window_note


@pytest.mark.parametrize("load_us, kept", [(2_000, True), (500, False)])
def test_triage_too_little_gpu_work_keeps_only_loading_of_a_millisecond_or_more(load_us, kept):
    """Two tiny kernels 5 ms apart: too little GPU work to classify the run, but a module load in the gap between
    them is a finding (it may be why the GPU did so little) once it costs 1 ms; half a millisecond is noise. Paid
    once with no loop, it is one-time setup, which takes the whole gap it was paid in (15 us to 5,010 us)."""
    kernels = [{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "correlation_id": c, "start_ns": s,
                "end_ns": s + 5_000, "short_name": "k", "name": "k", "launch_start_ns": s - 3_000,
                "launch_end_ns": s - 1_000} for c, s in ((1, 10_000), (2, 5_010_000))]
    load = {"pid": 1, "tid": 1, "name": "cuModuleLoadData", "kind": "module", "start_ns": 1_000_000,
            "end_ns": 1_000_000 + load_us * 1_000}
    result = triage.run(make_model(kernels=kernels, cuda_api=[load]), triage.Params(profile="t"))
    assert result.classification.bound == "too little GPU activity"
    assert [(f.root_cause, f.time_at_stake_ns) for f in result.findings] == (
        [("profiler-window-on-warmup", 5_010_000 - 15_000)] if kept else [])


@pytest.mark.parametrize("compile_ms", [30, 0])
def test_triage_compilation_before_the_loop_longer_than_the_window_is_warmup(compile_ms):
    """The window (steps 1-4, 10 ms) leaves out 100 ms of setup; idling on compilation for longer than the window
    there makes the capture mostly one-time warmup. The setup's one gap (100.5 ms) is a jit gap for the 30 ms the
    module load runs (analysis/attribution.py), and only those are at stake; without one, the gap is unexplained, not
    warmup."""
    con, starts = irregular_loop(100, compile_ms=compile_ms)
    result = triage.run(con, triage.Params(profile="t"))
    assert result.window.duration_ns == starts[-1] - starts[1] == 10 * MS
    setup = [(f.root_cause, f.device, f.time_at_stake_ns) for f in result.findings if "setup-compile" in f.tags]
    assert setup == ([("profiler-window-on-warmup", 0, compile_ms * MS)] if compile_ms else [])


def test_triage_ranks_by_time_at_stake_and_cites_the_book(demo_triage):
    result, _ = demo_triage
    stakes = [f.time_at_stake_ns for f in result.findings]
    assert stakes == sorted(stakes, reverse=True)
    assert [f.rank for f in result.findings] == list(range(1, len(result.findings) + 1))
    for f in result.findings:
        entry = book.get_entry(f.root_cause)
        assert f.book_uri == f"stallhound://book/{entry.id}" and f.verify == entry.verify_for(f.tags)
        fix = entry.fix_for(tuple(result.program.fix_chain), f.tags)
        assert (f.fix, f.fix_for) == (triage.fitted(fix.text, f.evidence), fix.family)


def test_triage_clean_sample_is_quiet(clean):
    profile, _ = clean
    result = triage.run(profile.con, triage.Params(profile="clean"))
    loud = [f"{f.root_cause}: {f.title}" for f in result.findings if f.severity in ("high", "medium")]
    assert loud == []
    assert result.classification.bound == "compute-bound" and result.window.window_basis == "steady_state"


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_triage_every_fixture_resolves_its_book_ids(open_fixture, stem):
    result = triage.run(open_fixture(stem).con, triage.Params(profile=stem))
    for f in result.findings:
        book.get_entry(f.root_cause)
    if stem == "dynamicvit_empty_export":
        assert result.classification.bound == "no GPU activity" and result.findings == [] and result.window is None
        assert {m.data for m in result.missing} >= {"kernels", "nvtx"}


def test_triage_markdown_has_a_row_per_finding(demo_triage):
    result, _ = demo_triage
    text = triage.render_markdown(result)
    assert sum(line.startswith("| ") and "stallhound://book/" in line for line in text.splitlines()) == len(
        result.findings)


def _raw(stem: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{FIXTURES / stem}.sqlite?mode=ro", uri=True)


def _answers(open_fixture, stem: str) -> dict[str, answer_questions.Answer]:
    result = answer_questions.run(open_fixture(stem).con, answer_questions.Params(profile=stem))
    return {a.id: a for a in result.answers}


def test_answer_questions_from_a_real_profile(open_fixture):
    """Answers cover triage's window: the raw figures are read over the same window."""
    answers = _answers(open_fixture, "nsysai_h100_2gpu_1s")
    w = triage.run(open_fixture("nsysai_h100_2gpu_1s").con, triage.Params(profile="h")).window
    raw = _raw("nsysai_h100_2gpu_1s")
    tiny = raw.execute('SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE "end" - start < 10000 '
                       "AND start >= ? AND start < ?", (w.start_ns, w.end_ns)).fetchone()[0]
    h2d = raw.execute("SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 "
                      "AND start >= ? AND start < ?", (w.start_ns, w.end_ns)).fetchone()
    assert answers["q01-gpu-hardware"].evidence == {"devices": [0, 1], "min_arch": 80}  # no TARGET_INFO_GPU
    assert answers["q13-small-kernels"].evidence["tiny_count"] == tiny
    assert answers["q16-h2d-volume"].evidence == {"count": h2d[0], "bytes": h2d[1]}
    assert answers["q12-dominant-kernel"].value.startswith("yes: the largest")
    assert answers["q22-dominant-collective"].value == "no NCCL kernels in this profile"
    assert answers["q04-batch-and-sequence"].status == "needs_user" and answers["q04-batch-and-sequence"].how
    launching = raw.execute("SELECT count(DISTINCT globalPid / 16777216) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert answers["q02-gpu-count-parallelism"].evidence["gpu_processes"] == launching


def test_answer_questions_expected_speedup_from_a_finding_inside_the_window():
    """Compiling before the loop ranks first (30 ms), but that time lies outside the 10 ms window and speeds
    no step: the bound comes from the costliest finding inside the window (the loop's 1 ms host gaps)."""
    con, _ = irregular_loop(100, compile_ms=30)
    result = triage.run(con, triage.Params(profile="t", limit=100))
    answers = {a.id: a for a in answer_questions.run(con, answer_questions.Params(profile="t")).answers}
    assert [(f.root_cause, f.time_at_stake_ns) for f in result.findings] == [
        ("profiler-window-on-warmup", 30 * MS), ("gpu-bubbles", 7 * MS),
        ("profiler-window-on-warmup", 3 * MS // 2)]
    assert answers["q35-expected-speedup"].evidence == {"time_at_stake_ns": 7 * MS, "window_ns": 10 * MS}


def test_answer_questions_every_question_has_one_status(open_fixture):
    result = answer_questions.run(open_fixture("fuser_h200_crossentropy").con,
                                  answer_questions.Params(profile="fuser"))
    assert len(result.answers) == len(book.load_questions())
    assert result.answered + result.not_in_profile + result.needs_user == len(result.answers)
    for a in result.answers:
        assert (a.value is not None) == (a.status == "answered")
        assert a.status == "answered" or a.how


def test_answer_questions_empty_profile_answers_nothing_from_data(open_fixture):
    result = answer_questions.run(open_fixture("dynamicvit_empty_export").con,
                                  answer_questions.Params(profile="empty", phase="kernels"))
    assert result.answered == 0 and {a.phase for a in result.answers} == {"kernels"}


def test_answer_questions_unknown_phase_names_the_valid_ones(open_fixture):
    with pytest.raises(book.UnknownPhase, match="orientation"):
        answer_questions.run(open_fixture("nsysai_mock").con, answer_questions.Params(profile="m", phase="nope"))


FA3 = "void cutlass::device_kernel<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwd<2, cute::tuple<int>>>>(T1)"
FA3_BETA = "void flash::compute_attn_ws<Ktraits_fp8<128, 128, 128, 12>, true>(Flash_fwd_params)"
FA2 = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t>>(params)"


@pytest.mark.parametrize("name, version, hint", [
    (FA3, "3 (Hopper)", "flash-attn 3"),
    (FA3_BETA, "3 (Hopper)", "flash-attn 3"),
    (FA2, "2", "flash-attn 2"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(params)", "unknown", "another fused attention"),
])
def test_answer_questions_flash_version_agrees_with_profile_summary(name, version, hint):
    from modeldb import make_model

    from stallhound.tools import profile_summary
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "pid": 1, "start_ns": 0, "end_ns": 50,
                               "short_name": name.split("(")[0][-40:], "name": name, "category": "compute"}])
    answers = {a.id: a for a in answer_questions.run(con, answer_questions.Params(profile="t")).answers}
    assert answers["q15-flashattention"].value.startswith(f"yes, version {version}")
    summary = profile_summary.run(con, profile_summary.Params(profile="t"))
    [flash] = [lib for lib in summary.libraries if lib.library.startswith("FlashAttention")]
    assert hint in flash.version_hint


def test_answer_questions_flash_version_on_a_real_profile(open_fixture):
    raw = _raw("nsysai_mfu_2gpu_after")
    [(name,)] = raw.execute("""SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                               ON s.id = k.demangledName WHERE s.value LIKE '%flash%'""").fetchall()
    assert name.startswith("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<")  # the flash-attn 2 layout
    answers = _answers(open_fixture, "nsysai_mfu_2gpu_after")
    assert answers["q15-flashattention"].value == "yes, version 2 by kernel names: flash_fwd_kernel"


def test_triage_limit_keeps_the_costliest_findings(demo):
    profile, _ = demo
    everything = triage.run(profile.con, triage.Params(profile="demo", limit=100))
    top = triage.run(profile.con, triage.Params(profile="demo", limit=3))
    assert everything.total_findings == len(everything.findings) > 3 and not everything.truncated
    assert top.truncated and top.total_findings == everything.total_findings
    leads = {}
    for f in everything.findings:
        leads.setdefault(f.root_cause, f)
    expected = list(leads.values())[:3]  # each cause's costliest, before any per-device repeat
    assert [(f.root_cause, f.device, f.time_at_stake_ns) for f in top.findings] == [
        (f.root_cause, f.device, f.time_at_stake_ns) for f in expected]
    assert [f.rank for f in top.findings] == [1, 2, 3]
    assert f"{everything.total_findings - 3} more findings" in triage.render(top)


def test_answer_questions_peak_memory_only_where_the_capture_recorded_it(open_fixture):
    from stallhound.tools import profile_summary
    answer = _answers(open_fixture, "extrap_windows_con_kernel")["q19-peak-memory"]
    summary = profile_summary.run(open_fixture("extrap_windows_con_kernel").con, profile_summary.Params(profile="e"))
    assert answer.status == "answered"
    assert answer.evidence["peak_bytes"] == {d.device: d.peak_memory_bytes for d in summary.devices} == {0: 40_160_000}
    missing = _answers(open_fixture, "nsysai_h100_2gpu_1s")["q19-peak-memory"]
    assert missing.status == "not_in_profile" and "--cuda-memory-usage=true" in missing.how


def test_triage_shares_detector_results_once_per_model_each_caller_a_copy():
    """triage and answer_questions run the same detectors: common.run_once computes each once per model and
    parameters (the profile id aside) and hands out copies, so a caller's edits never reach the next caller."""
    import types

    from stallhound.analysis.common import run_once
    from stallhound.tools import top_kernels
    calls = []
    counted = types.SimpleNamespace(__name__="counted_top_kernels",
                                    run=lambda con, p: calls.append(p) or top_kernels.run(con, p))
    con, _ = irregular_loop(100)
    con.execute("UPDATE meta SET fingerprint = 'run-once-test'")
    first = run_once(con, counted, top_kernels.Params(profile="a"))
    first.kernel_count = -1
    again = run_once(con, counted, top_kernels.Params(profile="b"))
    other = run_once(con, counted, top_kernels.Params(profile="a", limit=1))
    assert len(calls) == 2 and again.kernel_count == 21 and len(other.rows) == 1


def test_triage_lacking_names_together_the_data_one_capture_records():
    missing = [rules.Missing(data="cpu_samples", capture_flag="x"), rules.Missing(data="nvtx", capture_flag="y"),
               rules.Missing(data="sched", capture_flag="x")]
    assert triage._lacking(missing, "`{}`") == "cpu_samples, sched (`x`); nvtx (`y`)"


def test_triage_fits_the_books_kernel_profiler_command_to_the_finding():
    """mcts2048 launches its hot kernel once: the book's `--launch-skip 10 --launch-count 3` would profile nothing;
    the fix carries the finding's own command (hotspots.ncu_command: no launch to skip)."""
    fix = book.get_entry("kernel-hotspot").fix_for(("cuda", "generic"), ["custom"]).text
    assert "`ncu --kernel-name regex:<name> --launch-skip 10 --launch-count 3 --set full -o hot ./app`" in fix
    own = "ncu --kernel-name simulate_random_play_kernel --launch-skip 0 --launch-count 1 --set full -o s ./MCTS"
    assert triage.fitted(fix, {"ncu": own}) == fix.replace(
        "`ncu --kernel-name regex:<name> --launch-skip 10 --launch-count 3 --set full -o hot ./app`", f"`{own}`")
    assert triage.fitted(fix, {"kernel": "k"}) == fix  # no command of its own: the book's stays
