"""The red-team harness itself, quickly (make test): a benign call through a real server passes every measure, a
cheap attack (a 1 MB path) is measured as issue 30 describes it, and each measure can fail (checked on planted
outcomes and inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixture_guard import FIXTURES_ROOT

from tests.security.harness import (
    BYSTANDER,
    MAX_SENTENCE_CHARS,
    Answer,
    Attack,
    Call,
    Limits,
    Outcome,
    Sandbox,
    StartRefused,
    run_attack,
    sandbox,
    sentence_problems,
    snapshot,
    start_http,
    written,
)

MOCK = FIXTURES_ROOT / "nsys" / "nsysai_mock.sqlite"
KERNELS_IN_MOCK = 2  # SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL on the export


def _bystander(box: Sandbox) -> str:
    return str(box.roots / BYSTANDER)


BENIGN = Attack(0, "a benign query", [
    Call("load_profile", lambda box: {"path": _bystander(box)}),
    Call("query_sql", lambda box: {"profile": _bystander(box), "sql": "SELECT count(*) AS n FROM kernels"})])


def test_harness_smoke_a_benign_call_passes_every_measure():
    out = run_attack(BENIGN, MOCK, "http")
    assert out.problems(Limits()) == []
    assert out.up and not out.hung and out.answers[-1] == Answer(False, f"n\n{KERNELS_IN_MOCK}")
    assert out.latencies_s and out.other_p99_ms is not None  # the bystander did call while the attack ran
    assert 50 < out.peak_rss_mb < Limits().peak_rss_mb  # a Python process with DuckDB in it, measured
    assert out.written_outside == [] and out.cache_growth_mb > 0  # the model went to the cache, nothing elsewhere


def test_harness_smoke_a_long_path_is_measured_and_its_answer_judged():
    """Over stdio (the benign call goes over HTTP); whether the server cuts the echo or not, the harness must report
    the answer's length as the client got it."""
    path = "/" + "a" * 1_000_000
    out = run_attack(Attack(10, "a 1 MB path", [Call("load_profile", {"path": path})]), MOCK, "stdio")
    assert out.up and out.answer is not None and out.answer.is_error
    too_long = len(out.answer.text) > MAX_SENTENCE_CHARS
    assert (f"answer: {len(out.answer.text):,} characters" in out.problems(Limits())) == too_long


def test_harness_smoke_a_server_that_will_not_start_says_why():
    with sandbox() as box, pytest.raises(StartRefused, match="invalid int value: 'lots'"):
        start_http(box, extra=("--memory-budget-mb", "lots"))


@pytest.mark.parametrize(("text", "problem"), [
    ("", "empty"), ("first\nsecond", "2 lines"), ("Traceback (most recent call last): x", "a traceback"),
    ("Error executing tool load_profile", "no reason"), ("x" * (MAX_SENTENCE_CHARS + 1), "401 characters"),
    ("INTERNAL Error: at 0x7f3a2b1c0d00", "native addresses")])
def test_harness_smoke_sentence_check_names_each_fault(text, problem):
    assert problem in sentence_problems(text)


def test_harness_smoke_sentence_check_passes_one_sentence():
    assert sentence_problems("Error executing tool load_profile: /x/y.sqlite does not exist; check the path") == []


def test_harness_smoke_each_measure_fails_an_outcome_past_its_limit():
    limits = Limits(peak_rss_mb=100, other_p99_ms=100)
    fine = Outcome(up=True, peak_rss_mb=50, latencies_s=[0.05] * 100, answers=[Answer(True, "no such file")])
    assert fine.problems(limits) == []
    assert fine.other_p99_ms == pytest.approx(50)
    assert Outcome(up=False, exit_note=" (killed by SIGABRT)").problems(limits)[0] == "went down (killed by SIGABRT)"
    bad = Outcome(up=False, hung=True, peak_rss_mb=200, latencies_s=[0.05] * 98 + [2.0, 2.0],
                  written_outside=["/home/x"], answers=[Answer(True, "a\nb")], harm="leaked")
    assert bad.problems(limits) == ["hung (killed at the wall limit)", "peak RSS 200 MB",
                                    "other client's p99 2000 ms", "wrote 1 files outside the cache",
                                    "answer: 2 lines", "leaked"]


def test_harness_smoke_snapshot_sees_a_new_and_a_changed_file(tmp_path: Path):
    (tmp_path / "kept").write_text("a")
    (tmp_path / "changed").write_text("a")
    before = snapshot((tmp_path,))
    (tmp_path / "changed").write_text("bb")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new").write_text("c")
    assert written(before, snapshot((tmp_path,))) == [str(tmp_path / "changed"), str(tmp_path / "sub" / "new")]
