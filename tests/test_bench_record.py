"""make bench's record: every run goes on top of BENCHMARKS-HISTORY.md, and BENCHMARKS.md holds the newest run of
each benchmark, read back from the history."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench_run(monkeypatch, root: Path):
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", root)
    return module


def test_bench_record_keeps_history_and_the_newest_run_of_each_kind(tmp_path, monkeypatch):
    run = _bench_run(monkeypatch, tmp_path)
    run.record("## 2026-01-01: 1 GB export and the 10 GB first answer, m\n\nold main\n")
    run.record("## 2026-01-02: Kineto trace load, m\n\nkineto\n")
    run.record("## 2026-01-03: 1 GB export and the 10 GB first answer, m\n\nnew main\n")
    history = (tmp_path / "BENCHMARKS-HISTORY.md").read_text()
    assert history.startswith(run.HISTORY_HEAD)
    assert [s.splitlines()[0][3:13] for s in run.sections(history)] == ["2026-01-03", "2026-01-02", "2026-01-01"]
    current = (tmp_path / "BENCHMARKS.md").read_text()
    assert current.startswith(run.CURRENT_HEAD)
    assert "kineto" in current and "new main" in current and "old main" not in current
    assert current.index("Kineto trace load") < current.index("1 GB export")  # KINDS' order


def test_bench_record_the_repositorys_files_agree():
    """BENCHMARKS.md is what record would write from BENCHMARKS-HISTORY.md (nobody edits it by hand)."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    history = (ROOT / "BENCHMARKS-HISTORY.md").read_text()
    assert history.startswith(run.HISTORY_HEAD)
    assert (ROOT / "BENCHMARKS.md").read_text() == run.current(history)


def test_bench_record_start_up_runs_are_their_own_kind(tmp_path, monkeypatch):
    run = _bench_run(monkeypatch, tmp_path)
    assert run.kind_of("## 2026-01-04: start-up on a small export (commit abc1234), m") == "start-up"
    assert run.kind_of("## 2026-01-04: 1 GB export and the 10 GB first answer, m") == "1 GB export"
