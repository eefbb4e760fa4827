"""The CI gate (action.yml): the script its step runs, end to end on a planted pair, with a job summary file as
GitHub gives one. The synthetic pair `slower_rank` plants a straggler rank: the candidate's steps are longer by a
known amount (the ground truth's lived iterations), so the gate must pass below it and fail above it."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import lived_iterations

from stallhound.model.cache import CACHE_ENV

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "action" / "gate.sh"
STALLHOUND = Path(sys.executable).parent / "stallhound"


def _gate(tmp_path: Path, cache: Path, baseline: Path, candidate: Path, pct: float) -> tuple[int, str, str]:
    """(exit status, the job summary, the log) of the gate's step."""
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step's summary\n")
    env = {**os.environ, "BASELINE": str(baseline), "CANDIDATE": str(candidate), "FAIL_ON_REGRESSION": f"{pct:g}",
           "GITHUB_STEP_SUMMARY": str(summary), "STALLHOUND": str(STALLHOUND), CACHE_ENV: str(cache)}
    done = subprocess.run(["bash", str(GATE)], capture_output=True, text=True, env=env, timeout=120, check=False)
    text = summary.read_text()
    assert text.startswith("earlier step's summary\n")  # appended, as GitHub expects
    return done.returncode, text.removeprefix("earlier step's summary\n"), done.stdout


def _planted_pct(truth_before: dict, truth_after: dict) -> float:
    """How much longer the candidate's steps are, in % of the baseline's (first, warmup step left out)."""
    before, after = (statistics.fmean(e - s for s, e in lived_iterations(t)[1:]) for t in (truth_before, truth_after))
    return 100 * (after - before) / before


def test_ci_gate_passes_the_same_work_and_fails_a_planted_regression(synth_pair, cache_root, tmp_path):
    (before, truth_b), (after, truth_a) = synth_pair("slower_rank")
    planted = _planted_pct(truth_b, truth_a)
    assert planted > 2  # a regression worth a gate
    status, summary, log = _gate(tmp_path, cache_root, before.path, before.path, 0)
    assert status == 0 and summary.startswith("## stallhound diff") and "no clear change" in summary
    assert summary == log  # the same markdown in the log and the summary
    status, summary, _ = _gate(tmp_path, cache_root, before.path, after.path, planted / 2)
    assert status == 1 and summary.startswith("## stallhound diff\n\n**regressed**: the same work")
    decided = re.search(r"median step .* \(\+([0-9.]+)%\) over", summary)
    assert decided and float(decided[1]) == pytest.approx(planted, rel=0.1)  # +16.4% planted, +16.4% read
    assert summary.endswith(f"**Regressed by more than {planted / 2:g}%: this check fails.**\n")
    status, summary, _ = _gate(tmp_path, cache_root, before.path, after.path, planted * 2)
    assert status == 0 and "regressed" in summary and "this check fails" not in summary


def test_ci_gate_says_in_the_summary_why_it_could_not_compare(synth_pair, cache_root, tmp_path):
    (before, _), _ = synth_pair("slower_rank")
    status, summary, _ = _gate(tmp_path, cache_root, before.path, tmp_path / "missing.sqlite", 5)
    assert status == 2 and "could not compare" in summary and "missing.sqlite" in summary


def test_ci_gate_action_runs_the_gate_with_its_inputs():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert {"baseline", "candidate", "fail-on-regression"} <= action["inputs"].keys()
    step = action["runs"]["steps"][-1]
    assert step["run"] == 'bash "$GITHUB_ACTION_PATH/action/gate.sh"'
    assert step["env"]["BASELINE"] == "${{ inputs.baseline }}" and step["env"]["CANDIDATE"] == "${{ inputs.candidate }}"
    assert step["env"]["FAIL_ON_REGRESSION"] == "${{ inputs.fail-on-regression }}"
