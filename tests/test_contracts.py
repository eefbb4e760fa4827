"""Every registered module satisfies its contract (analysis/contracts.py), signatures included; a build reports
the progress steps it declares."""

from __future__ import annotations

import importlib
import inspect
import threading
import time
from pathlib import Path

import pytest
from fixture_guard import FIXTURES_ROOT
from modeldb import make_model
from pydantic import BaseModel

from stallhound import synth, tools
from stallhound.analysis import contracts
from stallhound.analysis.common import Output
from stallhound.analysis.contracts import run_skill
from stallhound.formats import build_steps, open_profile
from stallhound.formats.kineto import build as kineto
from stallhound.formats.nsys import build as nsys_build
from stallhound.model.errors import LoadCancelled
from stallhound.tools import detectors, job_tools, pair_tools, skills

KINDS = [(contracts.Skill, skills, ("con", "params")), (contracts.PairSkill, pair_tools, ("before", "after", "params")),
         (contracts.JobSkill, job_tools, ("con", "params"))]
ENDLESS_SQL = "SELECT sum(hash(i)) FROM range(100_000_000_000) t(i)"  # minutes of work, unless interrupted
CANCEL_AFTER_S = 0.3
STOPPED_WITHIN_S = 10.0  # a generous bound on a loaded machine; the query alone runs for minutes


@pytest.mark.parametrize(("protocol", "registry", "run_args"), KINDS, ids=lambda k: getattr(k, "__name__", ""))
def test_contracts_every_registered_module_satisfies_its_protocol(protocol, registry, run_args):
    for name, module in registry().items():
        assert isinstance(module, protocol), f"{name} lacks a member of {protocol.__name__}"
        assert issubclass(module.Params, BaseModel) and issubclass(module.Result, Output), name
        assert tuple(inspect.signature(module.run).parameters) == run_args, name
        assert tuple(inspect.signature(module.render).parameters) == ("result",), name


TOOLS = Path(tools.__file__).parent


def _registered() -> dict:
    return {**skills(), **pair_tools(), **job_tools()}


def test_contracts_the_tools_are_the_modules_at_the_top_of_tools():
    """Every module directly in tools/ is a registered tool and every tool is one; helpers live in subpackages."""
    top = {p.stem for p in TOOLS.glob("*.py") if p.stem != "__init__"}
    assert top == set(_registered()) and len(top) == len(tools.TOOL_NAMES + tools.PAIR_TOOL_NAMES
                                                         + tools.JOB_TOOL_NAMES)
    helpers = [".".join(p.relative_to(TOOLS).with_suffix("").parts) for p in TOOLS.glob("*/*.py")]
    assert "diff.side" in helpers and "answers.answerers" in helpers
    for name in helpers:
        helper = importlib.import_module(f"stallhound.tools.{name}")
        assert not isinstance(helper, (contracts.Skill, contracts.PairSkill)), f"tools/{name} is a tool: move it up"


def test_contracts_detectors_are_the_modules_with_findings_of_their_result_and_a_triage_role():
    modules = _registered()
    found = {name for name, module in modules.items() if isinstance(module, contracts.Detector)}
    assert found == {name for name, _, _ in detectors()} and len(found) >= 9
    for name in found:
        assert tuple(inspect.signature(modules[name].findings).parameters) == ("result",), name


def test_contracts_triage_runs_its_detectors_in_the_declared_order(demo, monkeypatch):
    """What triage.run calls, recorded on a real profile: the warmup detector (through run_once), the idle one
    (its window_findings), then each window detector (through run_once), in the order their TRIAGE declares."""
    from stallhound.tools import triage
    ordered = detectors(*contracts.TRIAGED)
    assert [r.order for _, _, r in ordered] == sorted({r.order for _, _, r in ordered})  # each at its own place
    assert [r.how for _, _, r in ordered][:2] == ["warmup", "idle"]
    calls: list[str] = []
    run_once = triage.run_once

    def recorded(con, module, params):
        calls.append(module.__name__.rsplit(".", 1)[1])
        return run_once(con, module, params)
    monkeypatch.setattr(triage, "run_once", recorded)
    idle = tools.declared("idle")
    window_findings = idle.window_findings
    monkeypatch.setattr(idle, "window_findings", lambda *args: calls.append("idle") or window_findings(*args))
    triage.run(demo[0].con, triage.Params(profile="demo"))
    assert calls == [*("idle" if r.how == "idle" else n for n, _, r in ordered)]
    parted = {r.of for _, _, r in detectors("part")}
    assert parted and parted <= {n for n, _, r in ordered if r.how == "idle"}


def test_contracts_a_detector_without_a_triage_role_is_refused(monkeypatch):
    """A new tool with findings(result) but no TRIAGE cannot be silently left out of triage: the registry refuses
    it, and so does triage, which takes its detectors from the registry."""
    module = skills()["top_kernels"]
    monkeypatch.delattr(module, "TRIAGE")
    with pytest.raises(TypeError, match="tool top_kernels: a detector"):
        detectors()
    from stallhound.tools import triage
    con = make_model(kernels=[{"device_id": 0, "stream_id": 7, "pid": 1, "start_ns": 0, "end_ns": 1_000,
                               "name": "k", "short_name": "k"}])
    with pytest.raises(TypeError, match="tool top_kernels"):
        triage.run(con, triage.Params(profile="t"))


@pytest.mark.parametrize("how", contracts.SOLE)
def test_contracts_a_second_detector_for_a_sole_role_is_refused(monkeypatch, how):
    """Triage takes its window from the one warmup detector and its idle findings from the one idle detector: a
    second would hand it the same findings twice, so the registry refuses it."""
    assert len(detectors(how)) == 1
    monkeypatch.setattr(skills()["top_kernels"], "TRIAGE", contracts.TriageRole(how, order=9))
    with pytest.raises(TypeError, match=f"top_kernels all declare TriageRole\\('{how}'\\)"):
        detectors()


def test_contracts_a_triage_role_is_either_run_by_triage_or_points_elsewhere():
    with pytest.raises(ValueError, match="`order` goes with"):
        contracts.TriageRole("window")
    with pytest.raises(ValueError, match="`of` with 'part'"):
        contracts.TriageRole("part", order=3)
    assert contracts.TriageRole("part", of="gpu_idle_gaps").order is None


FIRING = {"iterations": "demo", "nccl_breakdown": "demo", "top_kernels": "clue_t4_report4", "gpu_idle_gaps": "demo",
          "sync_analysis": "demo", "kernel_launch_overhead": "demo", "thread_utilization": "clue_t4_report4",
          "memory_transfers": "demo", "unified_memory": "clue_t4_report4"}  # where each detector finds something
# (rank_imbalance needs a job: tests/test_rank_imbalance.py checks it the same way)


@pytest.mark.parametrize("name", sorted(FIRING))
def test_contracts_run_measures_and_run_skill_attaches_the_detectors_findings(request, open_fixture, name):
    con = request.getfixturevalue("demo")[0].con if FIRING[name] == "demo" else open_fixture(FIRING[name]).con
    module = skills()[name]
    params = module.Params(profile="p")
    figures = module.run(con, params)
    attached = run_skill(con, module, params)
    assert figures.findings == [] and attached.findings == module.findings(figures) != []
    assert attached.model_copy(update={"findings": []}) == figures
    assert set(FIRING) | {"rank_imbalance"} == {n for n, _, _ in detectors()}  # every detector is tried here


def test_contracts_run_skill_leaves_a_skill_without_findings_as_run_returns_it(demo):
    profile, _ = demo
    module = skills()["gpu_utilization"]
    params = module.Params(profile="demo")
    assert run_skill(profile.con, module, params) == module.run(profile.con, params) and not isinstance(
        module, contracts.Detector)


def test_contracts_a_module_missing_run_is_no_skill():
    class NoRun:
        Params, Result = BaseModel, Output

        @staticmethod
        def render(result):
            return ""

    assert not isinstance(NoRun(), contracts.Skill)


def _reported(path, tmp_path) -> list[tuple[int, int, str]]:
    seen: list[tuple[int, int, str]] = []
    open_profile(path, cache_dir=tmp_path / "cache", progress=lambda *step: seen.append(step)).close()
    return seen


def test_contracts_export_build_reports_each_declared_step_once(tmp_path):
    path = tmp_path / "clean.sqlite"
    synth.write_sample(path, synth.clean())
    seen = _reported(path, tmp_path)
    assert sorted(label for _, _, label in seen) == sorted(nsys_build.STEPS)
    assert [(done, total) for done, total, _ in seen] == [(i + 1, len(nsys_build.STEPS)) for i in range(len(seen))]


def test_contracts_kineto_build_reports_each_declared_step_once(tmp_path):
    seen = _reported(FIXTURES_ROOT / "kineto" / "hta_sampled_rank1.json.gz", tmp_path)
    assert [label for _, _, label in seen] == list(kineto.STEPS)
    assert seen[-1][:2] == (len(kineto.STEPS), len(kineto.STEPS))


def test_contracts_a_step_not_declared_is_refused(tmp_path):
    class Build(build_steps.BuildSteps):
        steps = ("one",)

    with pytest.raises(ValueError, match="'two' is not one of this build's steps"):
        Build(tmp_path / "x", tmp_path / "m.duckdb", None, "64MB").step("two")


def test_contracts_a_cancelled_export_build_stops_and_leaves_no_model(tmp_path):
    path = tmp_path / "clean.sqlite"
    synth.write_sample(path, synth.clean())
    cancelled = threading.Event()

    def progress(done, total, label):  # cancelled by the client once the GPU tables start
        if label == "kernels":
            cancelled.set()
    with pytest.raises(LoadCancelled, match="was cancelled"):
        open_profile(path, cache_dir=tmp_path / "cache", progress=progress, cancelled=cancelled)
    assert [p.name for p in (tmp_path / "cache").rglob("*") if ".duckdb" in p.name] == []


def test_contracts_cancelling_a_build_interrupts_its_running_query(tmp_path):
    cancelled = threading.Event()
    build = build_steps.BuildSteps(tmp_path / "x", tmp_path / "m.duckdb", None, "256MB", cancelled)
    threading.Timer(CANCEL_AFTER_S, cancelled.set).start()
    started = time.monotonic()
    with build.running(), pytest.raises(LoadCancelled):
        build.sql(ENDLESS_SQL)
    assert time.monotonic() - started < STOPPED_WITHIN_S
