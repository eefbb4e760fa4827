"""Bad files and a bad cache: every case is one sentence (what was wrong, what to do) or a model that says
what it left out, the server keeps serving, and nothing is ever written beside the profile."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import duckdb
import pytest
from conftest import FIXTURE_FILES, FIXTURES, REQUIRED_ARGS, one_sentence, text_of
from mcp.client import Client

from stallhound.formats import open_profile
from stallhound.model.errors import ConversionFailed, ProfileChanged
from stallhound.model.schema import MODEL_VERSION
from stallhound.server.app import build_server
from stallhound.tools import TOOL_NAMES

MOCK = FIXTURES / "nsysai_mock.sqlite"  # 2 kernels, on an RTX 3080
NVTX_FIXTURE = FIXTURES / "fuser_h200_crossentropy.sqlite"  # 18 kernels, 13,513 NVTX events
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
CLI = [sys.executable, "-m", "stallhound"]



@pytest.fixture(scope="module", autouse=True)
def fixtures_unchanged():
    def hashes():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in FIXTURE_FILES}
    before = hashes()
    yield
    assert hashes() == before, "a fixture file changed"



def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _copy(src: Path, folder: Path, name: str = "run.sqlite") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    shutil.copyfile(src, target)
    return target


def _alter(path: Path, *statements: str) -> Path:
    with sqlite3.connect(path) as con:
        for sql in statements:
            con.execute(sql)
    con.close()
    return path


def _loosen(table: str) -> tuple[str, ...]:
    """SQL that drops the table's NOT NULL constraints (CREATE TABLE AS keeps columns, not constraints)."""
    return (f"CREATE TABLE loose AS SELECT * FROM {table}", f"DROP TABLE {table}",
            f"ALTER TABLE loose RENAME TO {table}")


def _raw_count(path: Path, sql: str) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


# --- paths: refused with one sentence, by load_profile and by every tool ----------------------------------------

def _symlink(link: Path, target: Path | str) -> Path:
    link.symlink_to(target)
    return link


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


PATH_CASES = {
    "dotdot": (lambda root, out: f"{root}/../outside/run.sqlite", "is outside the allowed roots"),
    "symlink_out": (lambda root, out: str(_symlink(root / "link.sqlite", out / "run.sqlite")),
                    "is outside the allowed roots"),
    "absolute_outside": (lambda root, out: str(out / "run.sqlite"), "is outside the allowed roots"),
    "etc_passwd": (lambda root, out: "/etc/passwd", "is outside the allowed roots"),
    "file_url": (lambda root, out: f"file://{root}/good.sqlite", "is a URL"),
    "http_url": (lambda root, out: "http://example.com/run.sqlite", "is a URL"),
    "nul_byte": (lambda root, out: f"{root}/run\0.sqlite", "contains a NUL byte"),
    "fifo": (lambda root, out: str(_fifo(root / "pipe.sqlite")), "is not a regular file"),
    "dev_zero": (lambda root, out: "/dev/zero", "is not a regular file"),
    "proc_file": (lambda root, out: "/proc/self/status", "is empty"),
    "directory": (lambda root, out: str(root / "folder.sqlite"), "is a directory"),
    "missing": (lambda root, out: str(root / "missing.sqlite"), "does not exist"),
    "symlink_loop": (lambda root, out: str(_symlink(root / "loop.sqlite", root / "loop.sqlite")),
                     "cannot be resolved"),
    "name_too_long": (lambda root, out: str(root / ("x" * 300 + ".sqlite")), "cannot be resolved"),
    "empty": (lambda root, out: str(_write(root / "empty.sqlite", b"")), "is empty"),
    "truncated": (lambda root, out: str(_write(root / "cut.sqlite", MOCK.read_bytes()[:3000])),
                  "not a readable SQLite database"),
    "png": (lambda root, out: str(_write(root / "image.sqlite", b"\x89PNG\r\n\x1a\n" + bytes(200))),
            "not an SQLite file"),
}


def _zero_page(path: Path, table: str) -> Path:
    """`path` with the first page of `table` (its root, from sqlite_master) overwritten with zeros."""
    with sqlite3.connect(path) as con:
        size, = con.execute("PRAGMA page_size").fetchone()
        root, = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone()
    con.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * size: root * size] = bytes(size)
    return _write(path, bytes(data))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def path_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("paths")
    root, outside = base / "root", base / "outside"
    _copy(MOCK, root, "good.sqlite")
    _copy(MOCK, outside)
    (root / "folder.sqlite").mkdir()
    server = build_server([root, Path("/dev"), Path("/proc")], cache_dir=base / "cache")
    return server, root, outside


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(PATH_CASES))
async def test_bad_inputs_path_is_one_sentence_for_every_tool_and_the_server_keeps_serving(path_server, case):
    server, root, outside = path_server
    make, words = PATH_CASES[case]
    ref = make(root, outside)
    before = {root: _listing(root), outside: _listing(outside)}
    async with Client(server) as client:
        for name in ["load_profile", *TOOL_NAMES]:
            args = {"path": ref} if name == "load_profile" else {"profile": ref, **REQUIRED_ARGS.get(name, {})}
            with anyio.fail_after(30):  # a FIFO must not block the call
                result = await client.call_tool(name, args)
            assert result.is_error, name
            one_sentence(text_of(result))
            assert words in text_of(result), (name, text_of(result))
        good = await client.call_tool("top_kernels", {"profile": str(root / "good.sqlite")})
    assert not good.is_error and good.structured_content["kernel_count"] == _raw_count(
        MOCK, f"SELECT count(*) FROM {KERNEL}")
    assert {root: _listing(root), outside: _listing(outside)} == before


# --- broken data: load what is readable and say what was left out, or refuse with one sentence -----------------

def _drop(table: str):
    return lambda p: _alter(p, f"DROP TABLE {table}")


def _rename(column: str, to: str):
    return lambda p: _alter(p, f'ALTER TABLE {KERNEL} RENAME COLUMN "{column}" TO "{to}"')


def _kernel_times(update: str):
    return lambda p: _alter(p, *_loosen(KERNEL), f"UPDATE {KERNEL} SET {update} WHERE rowid = 1")


ALL = -1  # every kernel row is lost
# case -> (source export, alteration, words of the first trace-quality note or None, kernel rows planted as lost)
LOADED_CASES = {
    "kernel_table_dropped": (MOCK, _drop(KERNEL), None, ALL),
    "gpu_table_dropped": (MOCK, _drop("TARGET_INFO_GPU"), None, 0),
    "start_renamed": (MOCK, _rename("start", "begin"),
                      f"the export's {KERNEL} table has no column start (renamed or written by another tool), so its "
                      "2 rows were left out", ALL),
    "short_name_renamed": (MOCK, _rename("shortName", "short"), f"{KERNEL} table has no column shortName", ALL),
    "null_start": (MOCK, _kernel_times("start = NULL"), "1 of 2 kernels rows were left out because their times or "
                                                        "ids are damaged (1 without a start time)", 1),
    "null_end": (MOCK, _kernel_times('"end" = NULL'), "(1 without an end time)", 1),
    "negative_time": (MOCK, _kernel_times("start = -5"), "(1 with a negative time)", 1),
    "end_before_start": (MOCK, _kernel_times('"end" = start - 1000'), "(1 ending before they start)", 1),
    "text_in_a_time_column": (MOCK, _kernel_times("start = 'abc'"), "read cell by cell", 1),
    "wal_mode": (MOCK, lambda p: _alter(p, "PRAGMA journal_mode=WAL"), None, 0),
    "non_utf8_nvtx_text": (NVTX_FIXTURE, lambda p: _alter(
        p, "UPDATE NVTX_EVENTS SET text = CAST(x'ff41e9' AS TEXT) WHERE rowid % 3 = 0 AND text IS NOT NULL"), None, 0),
}


@pytest.fixture(scope="module")
def data_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("data")
    return build_server([base / "root"], cache_dir=base / "cache"), base / "root"


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(LOADED_CASES))
async def test_bad_inputs_damaged_export_loads_what_is_readable_and_every_tool_answers(data_server, case):
    server, root = data_server
    src, alter, note, lost = LOADED_CASES[case]
    recorded = _raw_count(src, f"SELECT count(*) FROM {KERNEL}")
    path = alter(_copy(src, root / case))
    before = _listing(path.parent)
    async with Client(server) as client:
        loaded = await client.call_tool("load_profile", {"path": str(path)})
        assert not loaded.is_error, text_of(loaded)
        pid, summary = loaded.structured_content["profile"], loaded.structured_content["summary"]
        for name in TOOL_NAMES:
            result = await client.call_tool(name, {"profile": pid, **REQUIRED_ARGS.get(name, {})})
            if result.is_error:  # only where the profile has no data for the tool
                one_sentence(text_of(result))
    assert summary["table_rows"]["kernels"] == (0 if lost == ALL else recorded - lost)
    quality = summary["trace_quality"]
    if note:
        assert note in quality[0], quality
    else:
        assert not any("left out" in q for q in quality), quality
    assert _listing(path.parent) == before


@pytest.mark.parametrize("case", ["kernel_table_dropped", "start_renamed"])
def test_bad_inputs_missing_kernel_data_reads_as_a_missing_capability(tmp_path, case):
    src, alter, _, _ = LOADED_CASES[case]
    profile = open_profile(alter(_copy(src, tmp_path / "user")), cache_dir=tmp_path / "cache")
    try:
        assert profile.con.execute("SELECT present, rows FROM capabilities WHERE data = 'kernels'").fetchone() == (
            False, 0)
    finally:
        profile.close()


def test_bad_inputs_gpu_table_dropped_leaves_the_device_unnamed(tmp_path):
    profile = open_profile(_drop("TARGET_INFO_GPU")(_copy(MOCK, tmp_path / "user")), cache_dir=tmp_path / "cache")
    try:
        assert profile.con.execute("SELECT device_id, name FROM gpus").fetchall() == [(0, None)]
    finally:
        profile.close()


def test_bad_inputs_non_utf8_nvtx_text_is_kept_as_escapes(tmp_path):
    path = LOADED_CASES["non_utf8_nvtx_text"][1](_copy(NVTX_FIXTURE, tmp_path / "user"))
    altered = _raw_count(path, "SELECT count(*) FROM NVTX_EVENTS WHERE text = CAST(x'ff41e9' AS TEXT)")
    profile = open_profile(path, cache_dir=tmp_path / "cache")
    try:
        assert altered > 0
        assert profile.con.execute("SELECT count(*) FROM nvtx WHERE text = '\\xFFA\\xE9'").fetchone()[0] == altered
    finally:
        profile.close()


REFUSED_CASES = {
    "string_table_dropped": (_drop("StringIds"), "has no readable StringIds table"),
    "zeroed_string_table": (lambda p: _zero_page(p, "StringIds"), "is not a readable SQLite database"),
    "truncated_half_way": (lambda p: _write(p, p.read_bytes()[: p.stat().st_size // 2]),
                           "is not a readable SQLite database"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(REFUSED_CASES))
async def test_bad_inputs_unusable_export_is_one_not_a_profile_sentence(data_server, case):
    server, root = data_server
    alter, words = REFUSED_CASES[case]
    path = alter(_copy(MOCK, root / case))
    before = _listing(path.parent)
    async with Client(server) as client:
        refused = await client.call_tool("load_profile", {"path": str(path)})
        good = await client.call_tool("top_kernels", {"profile": str(_copy(MOCK, root / f"{case}-good"))})
    assert refused.is_error and words in text_of(refused) and str(path) in text_of(refused), text_of(refused)
    one_sentence(text_of(refused))
    assert not good.is_error and good.structured_content["kernel_count"] == 2
    assert _listing(path.parent) == before


@pytest.mark.parametrize("case, words", [("fifo", "is not a regular file"), ("png", "not an SQLite file"),
                                         ("directory", "is a directory"), ("string_table", "StringIds")])
def test_bad_inputs_cli_exits_2_with_one_stderr_line(tmp_path, case, words):
    user = tmp_path / "user"
    target = {"fifo": lambda: _fifo(user / "pipe.sqlite"),
              "png": lambda: _write(user / "image.sqlite", b"\x89PNG\r\n\x1a\n" + bytes(200)),
              "directory": lambda: user,
              "string_table": lambda: _drop("StringIds")(_copy(MOCK, user))}
    user.mkdir()
    path = target[case]()
    before = _listing(user)
    done = subprocess.run([*CLI, "tool", "top_kernels", str(path), "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert _listing(user) == before


# --- the cache ---------------------------------------------------------------------------------------------------

def _kernels(path: Path, cache: Path) -> int:
    profile = open_profile(path, cache_dir=cache)
    try:
        return profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0]
    finally:
        profile.close()


def _models(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.duckdb"))


def _temporaries(cache: Path) -> list[str]:
    return [p.name for p in cache.iterdir() if ".tmp" in p.name or p.name.startswith(".wal-copy-")]


def test_bad_inputs_corrupt_cache_file_is_rebuilt(tmp_path):
    path, cache = _copy(MOCK, tmp_path / "user"), tmp_path / "cache"
    assert _kernels(path, cache) == 2
    (model,) = _models(cache)
    model.write_bytes(b"not a duckdb file" * 100)
    assert _kernels(path, cache) == 2
    assert _models(cache) == [model] and model.read_bytes()[:17] != b"not a duckdb file"
    assert _listing(path.parent) == ["run.sqlite"]


def test_bad_inputs_cache_file_of_an_older_model_is_rebuilt(tmp_path):
    path, cache = _copy(MOCK, tmp_path / "user"), tmp_path / "cache"
    assert _kernels(path, cache) == 2
    (model,) = _models(cache)
    with duckdb.connect(str(model)) as con:  # an older layout under the current name, short one table
        con.execute(f"UPDATE meta SET model_version = {MODEL_VERSION - 1}")
        con.execute("DROP TABLE kernels")
    assert _kernels(path, cache) == 2
    with duckdb.connect(str(model), read_only=True) as con:
        assert con.execute("SELECT model_version FROM meta").fetchone() == (MODEL_VERSION,)


def _open_count(args: tuple[str, str]) -> int:
    return _kernels(Path(args[0]), Path(args[1]))


def test_bad_inputs_two_processes_build_one_cache_once(tmp_path):
    from concurrent.futures import ProcessPoolExecutor
    src = FIXTURES / "nsysai_h100_2gpu_1s.sqlite"
    path, cache = _copy(src, tmp_path / "user"), tmp_path / "cache"
    with ProcessPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(_open_count, [(str(path), str(cache))] * 2))
    assert counts == [_raw_count(src, f"SELECT count(*) FROM {KERNEL}")] * 2
    assert len(_models(cache)) == 1 and _temporaries(cache) == []
    assert _listing(path.parent) == ["run.sqlite"]


KILL_HALF_WAY = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from stallhound.formats import open_profile

    def progress(done, total, label):
        if done == total // 2:
            os.kill(os.getpid(), signal.SIGKILL)

    open_profile(Path(sys.argv[1]), cache_dir=Path(sys.argv[2]), progress=progress)
""")


def test_bad_inputs_build_killed_half_way_is_rebuilt_cleanly(tmp_path):
    path, cache = _copy(NVTX_FIXTURE, tmp_path / "user"), tmp_path / "cache"
    done = subprocess.run([sys.executable, "-c", KILL_HALF_WAY, str(path), str(cache)], timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL
    assert _models(cache) == [] and _temporaries(cache), "the killed build left no partial file to clean up"
    assert _kernels(path, cache) == 18
    assert len(_models(cache)) == 1 and _temporaries(cache) == []
    assert _listing(path.parent) == ["run.sqlite"]


def test_bad_inputs_unwritable_cache_folder_falls_back_to_a_temporary_build(tmp_path, caplog):
    """A cache that cannot be written still serves: the model is built in a temporary folder for this load."""
    path, cache = _copy(MOCK, tmp_path / "user"), _unwritable_cache(tmp_path)
    profile = open_profile(path, cache_dir=cache)
    try:
        assert profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 2
        assert not profile.model_path.is_relative_to(cache)
    finally:
        profile.close()
    assert not profile.model_path.exists()
    assert [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage() and str(cache) in
            r.getMessage()]
    assert _listing(path.parent) == ["run.sqlite"]


def _unwritable_cache(tmp_path: Path) -> Path:
    """A cache folder that cannot be written: read-only; for root, who may write anywhere, one under /proc,
    where nobody can create a folder."""
    if os.geteuid() == 0:
        return Path("/proc/stallhound-cache")
    cache = tmp_path / "readonly"
    cache.mkdir(mode=0o555)
    return cache


def test_bad_inputs_cli_with_an_unwritable_cache_answers_and_warns_once(tmp_path):
    path, cache = _copy(MOCK, tmp_path / "user"), _unwritable_cache(tmp_path)
    done = subprocess.run([*CLI, "tool", "top_kernels", str(path), "--cache-dir", str(cache), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kernel_count"] == _raw_count(MOCK, f"SELECT count(*) FROM {KERNEL}")
    assert done.stderr.count("\n") == 1 and f"the cache folder {cache} cannot be written" in done.stderr
    assert _listing(path.parent) == ["run.sqlite"]


def test_bad_inputs_file_rewritten_while_loading_is_refused_then_loads(tmp_path):
    path, cache = _copy(MOCK, tmp_path / "user"), tmp_path / "cache"

    def rewrite(done: int, total: int, label: str) -> None:
        if done == 3:
            shutil.copyfile(NVTX_FIXTURE, path)  # in place: same inode, new content

    with pytest.raises(ProfileChanged) as caught:
        open_profile(path, cache_dir=cache, progress=rewrite)
    one_sentence(str(caught.value))
    assert "changed while it was being loaded" in str(caught.value)
    assert _models(cache) == [] and _temporaries(cache) == []
    assert _kernels(path, cache) == 18
    assert _listing(path.parent) == ["run.sqlite"]


def test_bad_inputs_report_to_convert_with_an_unwritable_cache_isone_sentence(tmp_path, monkeypatch):
    nsys = tmp_path / "bin" / "nsys"  # present, so conversion is attempted; never reached
    nsys.parent.mkdir()
    nsys.write_text("#!/bin/sh\nexit 1\n")
    nsys.chmod(0o755)
    monkeypatch.setenv("PATH", str(nsys.parent))
    (tmp_path / "user").mkdir()
    report = _write(tmp_path / "user" / "run.nsys-rep", b"nsys report bytes")
    cache = _unwritable_cache(tmp_path)
    with pytest.raises(ConversionFailed) as caught:
        open_profile(report, cache_dir=cache)
    one_sentence(str(caught.value))
    assert f"cannot be written to {cache / 'exports'}" in str(caught.value)
    assert _listing(report.parent) == ["run.nsys-rep"]
