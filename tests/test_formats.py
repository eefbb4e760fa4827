"""The format seam: the registry picks a file's format in order, a format registered by one line is opened like
the others, and remedies are worded by the profile's format from its capture options, never by nsys strings in
tools."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
from modeldb import make_model

from stallhound import synth
from stallhound.formats import kineto, nsys, open_profile, registry
from stallhound.formats.base import Format
from stallhound.formats.derive import GPU_PHASE, KERNELS_IN_GRAPHS, NEEDS
from stallhound.formats.kineto.meta import CUDA_ACTIVITY, PLATFORM, capture_flags
from stallhound.formats.nsys import merged
from stallhound.formats.remedy import remedy
from stallhound.jobs.files import job_files
from stallhound.model.errors import NotAProfile, ProfileNotFound
from stallhound.model.schema import MODEL_VERSION

SRC = Path(__file__).resolve().parents[1] / "src" / "stallhound"
FAKE_MAGIC = b"FAKEPROF"
FAKE_PLATFORM = "fake profiler"
FAKE_ONLY = "fake_counters"  # a need the fake format alone records
KERNEL = {"device_id": 0, "stream_id": 7, "correlation_id": 1, "short_name": "k", "name": "k", "start_ns": 100,
          "end_ns": 300, "category": "compute"}


def _kineto_trace(path: Path) -> Path:
    path.write_text(json.dumps({"traceEvents": []}))
    return path


def test_formats_registry_detects_in_order(tmp_path):
    export = tmp_path / "run.sqlite"
    synth.write_sample(export, synth.clean())
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"not read: reports are known by their suffix")
    assert [f.name for f in registry.FORMATS] == ["nsys", "kineto"]
    assert registry.detect(export) is nsys.FORMAT
    assert registry.detect(report) is nsys.FORMAT
    assert registry.detect(_kineto_trace(tmp_path / "trace.json")) is kineto.FORMAT


def test_formats_an_unknown_file_gets_one_clear_error(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(NotAProfile) as err:
        open_profile(text, cache_dir=tmp_path / "cache")
    assert str(err.value) == (
        f"{text} is not an SQLite file (its first bytes are not an SQLite header) nor a JSON object; export the "
        "report with `nsys export --type sqlite report.nsys-rep`, or pass a torch.profiler trace (.json or .json.gz)")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name, fmt", [("trace.json", kineto.FORMAT), ("trace.json.gz", kineto.FORMAT),
                                       ("run.sqlite", nsys.FORMAT), ("run.nsys-rep", nsys.FORMAT)])
def test_formats_an_empty_file_gets_the_advice_of_the_format_it_is_named_for(tmp_path, name, fmt):
    path = _write(tmp_path / name, b"")
    with pytest.raises(NotAProfile) as err:
        open_profile(path, cache_dir=tmp_path / "cache")
    assert str(err.value) == f"{path} is empty (0 bytes); {fmt.expects[1]}"
    assert str(err.value).count(". ") == 0  # one sentence


def test_formats_an_empty_file_of_no_format_s_name_gets_every_format_s_advice(tmp_path):
    path = _write(tmp_path / "run.txt", b"")
    with pytest.raises(NotAProfile) as err:
        open_profile(path, cache_dir=tmp_path / "cache")
    assert str(err.value) == (f"{path} is empty (0 bytes); export the report with `nsys export --type sqlite "
                              "report.nsys-rep`, or pass a torch.profiler trace (.json or .json.gz)")


def test_formats_a_missing_path_or_a_folder_names_every_format_s_files(tmp_path):
    files = "nsys (.sqlite, .nsys-rep, .qdrep) or torch.profiler (.json, .json.gz)"
    with pytest.raises(ProfileNotFound) as missing:
        open_profile(tmp_path / "gone.json", cache_dir=tmp_path / "cache")
    assert str(missing.value) == f"{tmp_path / 'gone.json'} does not exist; pass the path of a profile: {files}"
    with pytest.raises(NotAProfile) as folder:
        open_profile(tmp_path, cache_dir=tmp_path / "cache")
    assert str(folder.value) == f"{tmp_path} is a directory; pass one profile inside it: {files}"


def test_formats_each_format_is_complete():
    assert len({f.name for f in registry.FORMATS}) == len(registry.FORMATS)
    assert [f.name for f in registry.FORMATS if f.platform is None] == ["nsys"]  # the one default of format_of
    for fmt in registry.FORMATS:
        assert set(fmt.options) <= set(NEEDS), fmt.name
        assert fmt.suffixes and all(s.startswith(".") for s in fmt.suffixes), fmt.name  # how a job's folder finds it
        assert len(fmt.expects) == 2 and all(fmt.expects), fmt.name  # what its files are, how to get one
    # every need is recorded by some format, so a remedy always has words
    assert set(NEEDS) <= {need for f in registry.FORMATS for need in f.options}


def _fake_build(source: Path, out: Path, key: str, progress, cancelled) -> None:
    con = make_model(meta={"fingerprint": key, "model_version": MODEL_VERSION, "platform": FAKE_PLATFORM,
                           "source_path": str(source)}, kernels=[KERNEL])
    con.execute(f"ATTACH '{out}' AS out")
    con.execute("COPY FROM DATABASE memory TO out")
    con.execute("DETACH out")
    con.close()


def _fake_detect(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(len(FAKE_MAGIC)) == FAKE_MAGIC


FAKE = Format(name="fake", writer="the fake profiler", detect=_fake_detect, build=_fake_build,
              damaged=lambda path, exc: None, read_errors=(),
              options={"kernels": "fake --gpu", FAKE_ONLY: "fake --counters"},
              say=lambda options, bare: " ".join(options), written_by=lambda version, schema: "fake",
              expects=("a fake profile", "pass one"), platform=FAKE_PLATFORM, suffixes=(".fake",),
              picks=_fake_detect)


def test_formats_a_format_registered_by_one_line_is_opened(tmp_path, monkeypatch):
    path = tmp_path / "run.fake"
    path.write_bytes(FAKE_MAGIC + b" one kernel")
    with pytest.raises(NotAProfile, match="nor a JSON object; "):
        open_profile(path, cache_dir=tmp_path / "cache")
    monkeypatch.setattr(registry, "FORMATS", (*registry.FORMATS, FAKE))
    profile = open_profile(path, cache_dir=tmp_path / "cache")
    try:
        assert profile.con.execute("SELECT platform, source_path FROM meta").fetchone() == (FAKE_PLATFORM, str(path))
        assert profile.con.execute("SELECT count(*), sum(duration_ns) FROM kernels").fetchone() == (1, 200)
        assert registry.format_of(profile.con) is FAKE
        assert remedy(profile.con, ("kernels",)) == "fake --gpu"  # its own words for what it records
        assert remedy(profile.con, ("kernels", "sched")) == "`nsys profile --trace=cuda --cpuctxsw=process-tree`"
        assert remedy(profile.con, ("sched",)) == "`nsys profile --cpuctxsw=process-tree`"  # only nsys records it
    finally:
        profile.close()
    # an nsys model's remedy for what only the fake records names the fake: the search reads the registry as it is
    assert remedy(make_model(kernels=[KERNEL]), (FAKE_ONLY,)) == "fake --counters"
    with pytest.raises(NotAProfile, match=r"is empty \(0 bytes\); pass one$"):
        open_profile(_write(tmp_path / "empty.fake", b""), cache_dir=tmp_path / "cache")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(NotAProfile, match="nor a JSON object nor a fake profile; .*, or pass one$"):
        registry.detect(other)
    (tmp_path / "rank_1.fake").write_bytes(FAKE_MAGIC)
    (tmp_path / "rank_2.fake").write_bytes(b"not one")  # named like one, but the format does not take it
    assert job_files(tmp_path) == [tmp_path / "rank_1.fake", path]  # a job's folder finds its files too


def test_formats_a_folder_of_runs_yields_each_format_s_files_and_nothing_else(tmp_path):
    export, trace = tmp_path / "rank_0.sqlite", _kineto_trace(tmp_path / "rank_1.json")
    export.write_bytes(b"anything named .sqlite")
    (tmp_path / "rank_0.sqlite.truth.json").write_text(json.dumps({"planted": []}))  # JSON that is no trace
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / ".rank_9.sqlite").write_bytes(b"hidden")
    assert job_files(tmp_path) == [export, trace]
    assert registry.profile_suffixes() == (".sqlite", ".nsys-rep", ".qdrep", ".json", ".json.gz")


def test_formats_remedy_kineto_model_vs_nsys_model():
    nsys_model = make_model(kernels=[KERNEL])
    kineto_model = make_model(meta={"platform": PLATFORM}, kernels=[KERNEL])
    assert registry.format_of(nsys_model) is nsys.FORMAT and registry.format_of(kineto_model) is kineto.FORMAT
    # what torch.profiler records is worded for it; an nsys export is told the nsys options
    assert remedy(kineto_model, ("kernels",)) == CUDA_ACTIVITY
    assert remedy(nsys_model, ("kernels", "nvtx")) == "`nsys profile --trace=cuda,nvtx`"
    assert remedy(nsys_model, ("nvtx",), bare=True) == "--trace=nvtx"
    # what torch.profiler cannot record sends both to nsys, for every need together
    for con in (nsys_model, kineto_model):
        assert remedy(con, ("sched",), bare=True) == "--cpuctxsw=process-tree"
        assert remedy(con, ("kernels", "nvtx", "os_runtime")) == "`nsys profile --trace=cuda,nvtx,osrt`"
        assert remedy(con, (KERNELS_IN_GRAPHS,), bare=True) == "--cuda-graph-trace=node"
        assert remedy(con, (GPU_PHASE,)) == "`nsys profile --capture-range=cudaProfilerApi`"


def test_formats_nsys_merges_one_capture_s_options():
    assert merged(["--trace=cuda", "--trace=osrt", "--sample=process-tree", "--cpuctxsw=process-tree"]) == (
        "--trace=cuda,osrt --sample=process-tree --cpuctxsw=process-tree")
    assert merged(["--trace=cuda --cuda-graph-trace=graph", "--trace=cuda", "--cuda-memory-usage=true"]) == (
        "--trace=cuda --cuda-graph-trace=graph --cuda-memory-usage=true")


def _strings(path: Path) -> list[str]:
    """The string constants of a module, docstrings left out (they describe, remedies are worded at run time)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_formats_tools_word_no_capture_command_themselves():
    found = [f"{path.relative_to(SRC)}: {s[:60]!r}" for folder in ("tools", "analysis")
             for path in sorted((SRC / folder).rglob("*.py")) for s in _strings(path)
             if "nsys profile" in s or "--trace=" in s]
    assert found == []


def test_formats_kineto_capabilities_name_the_capture_of_the_format_that_records_the_data(monkeypatch):
    """A Kineto trace's capability rows for data torch.profiler cannot record take their capture from the first
    registered format that records it, never from a copy of its options."""
    flags = capture_flags()
    assert flags["os_runtime"] == "not recorded by torch.profiler; capture the run with nsys --trace=osrt to get it"
    for data, flag in flags.items():
        assert flag == kineto.FORMAT.options.get(data, f"not recorded by torch.profiler; capture the run with nsys "
                                                       f"{nsys.FORMAT.options[data]} to get it"), data
    sched_first = replace(FAKE, options={"sched": "fake --sched"})
    monkeypatch.setattr(registry, "FORMATS", (kineto.FORMAT, sched_first, nsys.FORMAT))
    assert capture_flags()["sched"] == ("not recorded by torch.profiler; capture the run with the fake profiler "
                                        "fake --sched to get it")
