"""answer_questions reads triage's results: after a triage it runs only the tools no detector of triage covers,
and the answers it derives from triage's work equal what the tools themselves report on the same window."""

from __future__ import annotations

import re
import sqlite3
from types import SimpleNamespace

import pytest
from fixture_guard import FIXTURES_ROOT

from corpus import sources
from stallhound.analysis import common, program
from stallhound.formats import open_profile
from stallhound.tools import (
    answer_questions,
    gpu_idle_gaps,
    iterations,
    kernel_launch_overhead,
    skills,
    sync_analysis,
    thread_utilization,
    triage,
)
from stallhound.tools.answers import answerers
from stallhound.tools.answers import figures as answer_figures
from stallhound.tools.answers.evidence import Evidence

UNCOVERED = {"gpu_utilization", "profile_summary"}  # triage reads only the trace notes (trace_quality.of_model);
# the other uncovered figures: answer_figures; thread_utilization where it can answer


def _answers(con, profile: str) -> dict[str, answer_questions.Answer]:
    return {a.id: a for a in answer_questions.run(con, answer_questions.Params(profile=profile)).answers}


def test_answer_questions_after_triage_runs_only_the_tools_triage_does_not(demo, monkeypatch):
    profile, _ = demo
    monkeypatch.setattr(common, "_model_cache", {})  # a fresh per-model cache: nothing computed by other tests
    triage.run(profile.con, triage.Params(profile="demo"))
    ran: list[str] = []
    for name, module in skills().items():
        def counted(con, params, run=module.run, name=name):
            ran.append(name)
            return run(con, params)
        if name != "answer_questions":
            monkeypatch.setattr(module, "run", counted)
    answers = _answers(profile.con, "demo")
    # triage again with a larger limit: its detectors, attribution and shares come from the cache
    assert sorted(ran) == sorted({"triage"} | UNCOVERED), ran
    assert answers["q16-h2d-volume"].status == answers["q08-idle-gaps"].status == "answered"


@pytest.mark.parametrize("stem, basis", [("clue_t4_report4", "sched"), ("nsysai_h100_2gpu_1s", "cuda_api")])
def test_answer_questions_runs_thread_utilization_only_where_it_measures_cpu_time(open_fixture, stem, basis,
                                                                                   monkeypatch):
    """Traced API time (basis cuda_api) cannot say whether a thread runs flat out: the tool is not even run."""
    con = open_fixture(stem).con
    monkeypatch.setattr(common, "_model_cache", {})
    ran: list[str] = []
    def counted(con, params, run=thread_utilization.run):
        ran.append(params.profile)
        return run(con, params)
    monkeypatch.setattr(thread_utilization, "run", counted)
    answer = _answers(con, stem)["q25-hot-cpu-thread"]
    assert (bool(ran), answer.status) == ((True, "answered") if basis == "sched" else (False, "not_in_profile"))
    assert thread_utilization.basis(con) == basis


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "clue_t4_report4"])
def test_answer_questions_idle_answers_equal_gpu_idle_gaps_on_triages_window(open_fixture, stem):
    con = open_fixture(stem).con
    w = triage.run(con, triage.Params(profile=stem)).window
    gaps = gpu_idle_gaps.run(con, gpu_idle_gaps.Params(profile=stem, start_ns=w.start_ns, end_ns=w.end_ns))
    answers = _answers(con, stem)
    assert answers["q07-gpu-utilization"].evidence == {"busy_pct": {d.device: d.busy_pct for d in gaps.devices}}
    assert answers["q08-idle-gaps"].evidence == {"gap_count": gaps.gap_count, "gap_time_ns": gaps.gap_time_ns}
    launch_tiny = sum(c.idle_ns for d in gaps.devices for c in d.by_cause if c.cause == "launch_tiny")
    assert answers["q13-small-kernels"].evidence["launch_idle_ns"] == launch_tiny


def test_answer_questions_device_syncs_are_all_of_the_windows(demo):
    profile, _ = demo
    con = profile.con
    w = triage.run(con, triage.Params(profile="demo")).window
    every = sync_analysis.run(con, sync_analysis.Params(profile="demo", start_ns=w.start_ns, end_ns=w.end_ns,
                                                        limit=common.MAX_LIMIT))
    device_wide = [a for a in every.apis if a.scope_kind == "device"]
    assert sum(a.count for a in device_wide) > 0
    assert _answers(con, "demo")["q28-device-synchronize"].evidence == {"count": sum(a.count for a in device_wide)}
    assert every.device_sync_ns == sum(a.blocked_ns for a in device_wide)
    assert Evidence(con, "demo").device_syncs() == answer_figures.DeviceSyncs(
        count=every.device_sync_count, blocked_ns=every.device_sync_ns)


@pytest.mark.parametrize("busy, net, verdict", [
    (99.8, 99.5, "yes: the busiest, main, is busy 99.8% of the window, 99.5% outside blocking CUDA calls: work of its "
                 "own on the CPU"),
    (96.9, 13.8, "yes: the busiest, main, is busy 96.9% of the window, but 83.1 points of it inside blocking CUDA "
                 "calls"),
    (60.0, 60.0, "no: the busiest, main, is busy 60.0% of the window"),
])
def test_answer_questions_hot_thread_is_answered_by_busy_time_and_says_where_it_goes(monkeypatch, busy, net,
                                                                                      verdict):
    """Question 25 asks whether a thread is busy over 90% of the time: a thread at 96.9% is, even when most of it
    sits in blocking CUDA calls; the answer then says so instead of denying a hot thread."""
    row = thread_utilization.ThreadRow(pid=1, tid=1, name="main", busy_ns=0, busy_pct=busy, blocked_ns=0,
                                       net_busy_pct=net)
    e = SimpleNamespace(con=None, tool=lambda *a, **k: SimpleNamespace(rows=[row]))
    monkeypatch.setattr(thread_utilization, "basis", lambda con: "sched")
    text, figures = answerers.ANSWERERS["q25-hot-cpu-thread"](e)
    assert text.startswith(verdict) and figures == {"busy_pct": busy, "net_busy_pct": net}


CORPUS = {p.name: p for p in sources.load()}


@pytest.mark.parametrize("name, q25, q28", [
    # WSL2 capture of API calls alone: 5,123 cuCtxSynchronize (driver API) + 11 cudaDeviceSynchronize, no kernels
    ("qcu_quda_wsl_apionly.sqlite", "83.1 points of it inside blocking CUDA calls", 5_134),
    # OpenMP target heat stencil: the main thread sits in pageable cuMemcpy*Async calls
    ("sc23omp_heat_mapeveryiter.sqlite", "inside blocking CUDA calls", 0),
])
def test_answer_questions_corpus_hot_thread_and_device_syncs_agree_with_the_export(cache_root, name, q25, q28):
    path = sources.resolve(CORPUS[name.removesuffix(".sqlite")])
    if path is None:
        pytest.skip(f"corpus profile {name} is not restored in {sources.cache_dir()} (make corpus-restore)")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = raw.execute("SELECT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId")
    device_wide = sum(1 for (v,) in names if re.match(r"(cuda|cu)(Device|Ctx|Thread)Synchronize", v))
    profile = open_profile(path, cache_dir=cache_root)
    try:
        answers = _answers(profile.con, name)
    finally:
        profile.close()
    assert device_wide == q28 == answers["q28-device-synchronize"].evidence["count"]
    assert answers["q28-device-synchronize"].value.startswith("yes" if q28 else "no")
    assert answers["q25-hot-cpu-thread"].value.startswith("yes") and q25 in answers["q25-hot-cpu-thread"].value


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "clue_t4_report4"])
def test_answer_questions_small_kernels_equal_kernel_launch_overhead_on_triages_window(open_fixture, stem):
    con = open_fixture(stem).con
    w = triage.run(con, triage.Params(profile=stem)).window
    tool = kernel_launch_overhead.run(con, kernel_launch_overhead.Params(profile=stem, start_ns=w.start_ns,
                                                                         end_ns=w.end_ns))
    found = _answers(con, stem)["q13-small-kernels"]
    assert tool.kernel_count > 0
    assert found.evidence["tiny_count"] == tool.tiny_count and found.evidence["kernel_count"] == tool.kernel_count
    assert f"({tool.tiny_kernel_pct:.1f}%) run under {tool.threshold_ns / 1000:g} us" in found.value


@pytest.mark.parametrize("sample", ["demo", "clean"])
def test_answer_questions_steps_in_window_equal_the_iterations_found_inside_it(request, sample):
    profile, _ = request.getfixturevalue(sample)
    w = triage.run(profile.con, triage.Params(profile=sample)).window
    inside = iterations.run(profile.con, iterations.Params(profile=sample, start_ns=w.start_ns, end_ns=w.end_ns))
    evidence = Evidence(profile.con, sample)
    assert w.window_basis == "steady_state"
    assert evidence.steps_in_window() == inside.iteration_count > 0


def test_answer_questions_q18_and_the_readback_finding_count_the_same_small_reads(demo):
    """The demo plants .item() reads (4 bytes, then a synchronize): the answer counts them with the definition the
    blocking-d2h-sync finding uses (rules.SMALL_READ_BYTES, blocking by the same rules), so a finding about small
    reads never stands beside "0 small D2H copies"."""
    profile, truth = demo
    answer = _answers(profile.con, "demo")["q18-unexpected-d2h"]
    result = triage.run(profile.con, triage.Params(profile="demo", limit=100))
    reads = [f for f in result.findings if f.root_cause == "blocking-d2h-sync"]
    assert reads and answer.status == "answered"
    figures = answer.evidence
    calls = sum(f.evidence["calls"] for f in reads)
    assert figures["readback_calls"] == calls and figures["readback_idle_ns"] == sum(f.time_at_stake_ns for f in reads)
    assert 0 < calls <= figures["small_d2h_blocking"] <= figures["small_d2h"]
    assert f"after {calls:,} of those reads" in answer.value


@pytest.mark.parametrize("name", ["hta_sampled_rank0", "hta_a100_nccl_rank0"])
def test_answer_questions_gc_question_agrees_with_the_program_kind_on_torch_profiler_traces(cache_root, name):
    """q26 said 'not a Python program (cuda)' for hta_sampled, a PyTorch trace whose process is 'pyper:trainer'."""
    profile = open_profile(FIXTURES_ROOT / "kineto" / f"{name}.json.gz", cache_dir=cache_root)
    try:
        answer = _answers(profile.con, name)["q26-gc-pauses"]
        kind = program.detect(profile.con)
    finally:
        profile.close()
    assert (kind.kind, kind.language) == ("pytorch", "python")
    assert answer.status == "answered" and not answer.value.startswith("not a Python program"), answer.value


def test_answer_questions_gc_question_on_a_native_program_names_its_kind_and_language(open_fixture):
    answer = _answers(open_fixture("clue_t4_report4").con, "clue")["q26-gc-pauses"]
    assert answer.value == "not a Python program (cuda, native host code): no Python collector"
