"""The answer memo (cli/memo.py): a kept answer is the computed one byte for byte, is served only while the profile,
the parameters and the code are those it was computed from, imports nothing that reads a profile, writes only in the
cache folder, and never fails a command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_guard import FIXTURES_ROOT

import stallhound
from stallhound.cli import main, memo

NSYS = FIXTURES_ROOT / "nsys" / "nsysai_mock.sqlite"
KINETO = FIXTURES_ROOT / "kineto" / "hta_sampled_rank0.json.gz"
HEAVY = {"duckdb", "numpy", "pydantic", "ijson"}


@pytest.fixture
def kept(monkeypatch):
    """The memos written by main, as (path, status) in order: a miss writes one, a hit none."""
    written: list[tuple[Path, int]] = []
    keep = memo.keep

    def counting(m: memo.Memo, out: str, status: int) -> None:
        written.append((m.path, status))
        keep(m, out, status)

    monkeypatch.setattr(memo, "keep", counting)
    return written


def _run(argv: list[str], capsys) -> tuple[int, str]:
    status = main.main(argv)
    return status, capsys.readouterr().out


@pytest.mark.parametrize("profile", [NSYS, KINETO], ids=["nsys", "kineto"])
@pytest.mark.parametrize("form", [[], ["--json"], ["--markdown"]], ids=["text", "json", "markdown"])
def test_a_kept_triage_is_the_computed_one_byte_for_byte(profile, form, tmp_path, capsys, kept):
    argv = ["triage", str(profile), *form, "--cache-dir", str(tmp_path)]
    computed = _run(argv, capsys)
    assert len(kept) == 1
    again = _run(argv, capsys)
    assert len(kept) == 1, "the second call was served from the memo"
    assert again == computed
    assert computed == _run([*argv, "--no-cache"], capsys)
    assert len(kept) == 1, "--no-cache neither reads nor writes the memo"
    assert computed[0] == 0 and computed[1].strip()


def test_a_kept_diff_keeps_its_exit_status(tmp_path, capsys, kept):
    before, after = (FIXTURES_ROOT / "nsys" / f"nsysai_mfu_2gpu_{side}.sqlite" for side in ("before", "after"))
    argv = ["diff", str(before), str(after), "--fail-on-regression", "0", "--cache-dir", str(tmp_path)]
    computed = _run(argv, capsys)
    assert computed[0] == main.diff.EXIT_REGRESSED and computed[1].startswith("verdict: regressed")
    assert _run(argv, capsys) == computed and len(kept) == 1
    assert _run([*argv[:3], "--cache-dir", str(tmp_path)], capsys) == (0, computed[1]), "no gate: another call"
    assert len(kept) == 2


def test_a_changed_profile_parameter_or_code_is_computed_again(tmp_path, capsys, kept, monkeypatch):
    profile = tmp_path / "run.sqlite"
    shutil.copyfile(NSYS, profile)
    cache = tmp_path / "cache"
    argv = ["triage", str(profile), "--json", "--cache-dir", str(cache)]
    first = _run(argv, capsys)
    _run(argv, capsys)
    assert len(kept) == 1
    os.utime(profile, ns=(profile.stat().st_atime_ns, profile.stat().st_mtime_ns + 1))
    assert _run(argv, capsys) == first and len(kept) == 2, "a touched profile"
    _run(argv[:2] + argv[3:], capsys)
    assert len(kept) == 3, "another output form"
    tops = [_run(["tool", "top_kernels", str(profile), "-p", f"limit={n}", "--cache-dir", str(cache)], capsys)
            for n in (1, 2, 1)]
    assert len(kept) == 5 and tops[0] == tops[2] != tops[1], "another parameter"
    monkeypatch.setattr(memo, "code_stamp", lambda: "edited")
    assert _run(argv, capsys) == first and len(kept) == 6, "other code"
    monkeypatch.setenv("STALLHOUND_MAX_RESULT_CHARS", "100000")
    _run(argv, capsys)
    assert len(kept) == 7, "another setting"
    assert {path.parent for path, _ in kept} == {cache / memo.MEMO_FOLDER}
    assert len({path for path, _ in kept}) == 4, "one file per call: a new stamp replaces the old answer"


def test_the_code_stamp_follows_every_source_file(tmp_path, monkeypatch):
    package = tmp_path / "stallhound"
    shutil.copytree(Path(stallhound.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(stallhound, "__file__", str(package / "__init__.py"))
    stamps = [memo.code_stamp.__wrapped__()]
    for name in ("tools/triage.py", "book/entries/gpu-bubbles.md", "model/sql_files.py"):
        source = package / name
        source.write_text(source.read_text(encoding="utf-8") + "\n", encoding="utf-8")
        stamps.append(memo.code_stamp.__wrapped__())
    sql = next(package.rglob("*.sql"))
    os.utime(sql, ns=(sql.stat().st_atime_ns, sql.stat().st_mtime_ns + 1))
    stamps.append(memo.code_stamp.__wrapped__())
    assert len(set(stamps)) == len(stamps) == 5
    (package / "notes.txt").write_text("not source", encoding="utf-8")
    assert memo.code_stamp.__wrapped__() == stamps[-1]


def test_a_corrupt_memo_is_ignored_and_rewritten(tmp_path, capsys, kept):
    argv = ["triage", str(NSYS), "--cache-dir", str(tmp_path)]
    computed = _run(argv, capsys)
    path = kept[0][0]
    for junk in (b"{\"stamp\": ", b"\xff\xfe", json.dumps({"stamp": json.loads(path.read_text())["stamp"],
                                                            "out": 3, "status": 0}).encode()):
        path.write_bytes(junk)
        assert _run(argv, capsys) == computed
        assert json.loads(path.read_text())["out"] == computed[1]
    assert len(kept) == 4


def test_an_unwritable_memo_folder_never_fails_the_command(tmp_path, capsys, kept):
    (tmp_path / memo.MEMO_FOLDER).write_text("a file where the folder would be", encoding="utf-8")
    argv = ["triage", str(NSYS), "--cache-dir", str(tmp_path)]
    computed = _run(argv, capsys)
    assert computed[0] == 0 and computed[1].strip()
    assert _run(argv, capsys) == computed and len(kept) == 2, "nothing kept, so computed again"


def test_a_query_is_never_kept(tmp_path, capsys, kept):
    _run(["tool", "query_sql", str(NSYS), "-p", "sql=SELECT 1 AS one", "--cache-dir", str(tmp_path)], capsys)
    assert kept == [] and not (tmp_path / memo.MEMO_FOLDER).exists()


# Runs main on argv in a fresh interpreter and prints the modules then loaded.
PROBE = """
import json, sys
from stallhound.cli.main import main
main(json.loads(sys.argv[1]))
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def test_a_hit_imports_nothing_that_reads_a_profile_and_writes_only_the_cache(tmp_path):
    """Run in a fresh process, from a folder of its own, on a profile in a folder of its own: the miss writes the
    model and the memo in the cache folder and nothing beside the profile or in the working folder; the hit then
    imports none of DuckDB, numpy, pydantic or the tools."""
    folders = {name: tmp_path / name for name in ("work", "data", "cache")}
    for folder in folders.values():
        folder.mkdir()
    profile = folders["data"] / NSYS.name
    shutil.copyfile(NSYS, profile)
    argv = ["tool", "gpu_utilization", str(profile), "--cache-dir", str(folders["cache"])]
    outs, loaded = [], []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                              timeout=120, cwd=folders["work"])
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout)
        loaded.append(json.loads(done.stderr.splitlines()[-1]))
    assert outs[0] == outs[1] and "utiliz" in outs[0].lower()
    assert {"duckdb", "stallhound.tools.gpu_utilization"} <= set(loaded[0])
    assert [m for m in loaded[1] if m.split(".")[0] in HEAVY or m.startswith("stallhound.tools")] == []
    assert sorted(p.name for p in folders["data"].iterdir()) == [NSYS.name]
    assert list(folders["work"].iterdir()) == []
    assert [p.name for p in (folders["cache"] / memo.MEMO_FOLDER).iterdir() if p.name.endswith(".json")] != []
