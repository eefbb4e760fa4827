"""Ingest: every real export loads into the model, figures agree with independent SQL on the raw file,
bad inputs fail with one clear sentence, and the cache never touches the user's folder."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from conftest import FIXTURE_FILES, FIXTURE_IDS, FIXTURES

from nsightful.profiles import open_profile
from nsightful.profiles.errors import ConversionNeeded, NotAProfile, ProfileNotFound
from nsightful.profiles.model import TABLE_NAMES

ROOT = Path(__file__).resolve().parents[1]


def _hashes() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in FIXTURE_FILES}


@pytest.fixture(scope="module", autouse=True)
def fixtures_unchanged():
    before = _hashes()
    yield
    assert _hashes() == before, "a fixture file changed during the tests"


def _raw(stem: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{FIXTURES / stem}.sqlite?mode=ro", uri=True)


def _has(raw: sqlite3.Connection, table: str) -> bool:
    return raw.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0] > 0


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_profiles_fixture_summary(open_fixture, stem, snapshot):
    con = open_fixture(stem).con
    meta = con.execute("""SELECT nsys_version, schema_version, metadata_table, enum_source, capture_start_ns,
                          capture_end_ns, gpu_start_ns, gpu_end_ns FROM meta""").fetchone()
    summary = {
        "meta": meta,
        "devices": con.execute("SELECT device_id, name, sm_count FROM gpus ORDER BY 1").fetchall(),
        "rows": {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLE_NAMES},
        "capabilities": con.execute("SELECT data, present FROM capabilities ORDER BY data").fetchall(),
    }
    assert summary == snapshot


@pytest.mark.parametrize("stem", [s for s in FIXTURE_IDS if s != "dynamicvit_empty_export"])
def test_profiles_kernel_time_per_device_matches_raw(open_fixture, stem):
    raw = _raw(stem)
    expected = raw.execute("""SELECT deviceId, count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL
                              GROUP BY 1 ORDER BY 1""").fetchall()
    got = open_fixture(stem).con.execute("""SELECT device_id, count(*), sum(duration_ns) FROM kernels
                                            GROUP BY 1 ORDER BY 1""").fetchall()
    assert got == expected


@pytest.mark.parametrize("stem", [s for s in FIXTURE_IDS if s != "dynamicvit_empty_export"])
def test_profiles_bytes_per_copy_direction_match_raw(open_fixture, stem):
    raw = _raw(stem)
    if not _has(raw, "CUPTI_ACTIVITY_KIND_MEMCPY"):
        pytest.skip("no copies in this export")
    enum = "ENUM_CUDA_MEMCPY_OPER" if _has(raw, "ENUM_CUDA_MEMCPY_OPER") else None
    rows = raw.execute("SELECT copyKind, count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1").fetchall()
    names = dict(raw.execute(f"SELECT id, name FROM {enum}").fetchall()) if enum else {1: "HTOD", 2: "DTOH", 8: "DTOD"}
    short = {"HTOD": "H2D", "DTOH": "D2H", "DTOD": "D2D", "PTOP": "P2P", "HTOH": "H2H"}

    def label(name: str) -> str:
        suffix = name.removeprefix("CUDA_MEMCPY_KIND_")
        for code, text in short.items():
            suffix = suffix.replace(code, text)
        return suffix

    expected = sorted((label(names[k]), n, b) for k, n, b in rows)
    got = open_fixture(stem).con.execute("SELECT direction, count(*), sum(bytes) FROM memcpy GROUP BY 1").fetchall()
    assert sorted(got) == expected


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "fuser_h200_crossentropy", "pipit_saxpy_mpi_a100"])
def test_profiles_nvtx_and_api_counts_match_raw(open_fixture, stem):
    raw = _raw(stem)
    push_pop = raw.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()[0]
    api = raw.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    con = open_fixture(stem).con
    assert con.execute("SELECT count(*) FROM nvtx WHERE kind = 'push_pop'").fetchone()[0] == push_pop
    assert con.execute("SELECT count(*) FROM cuda_api").fetchone()[0] == api


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "fuser_h200_crossentropy"])
def test_profiles_nvtx_depth_matches_a_stack_walk(open_fixture, stem):
    rows = open_fixture(stem).con.execute("""SELECT pid, tid, start_ns, end_ns, depth FROM nvtx
        WHERE kind = 'push_pop' AND end_ns IS NOT NULL ORDER BY pid, tid, start_ns, end_ns DESC""").fetchall()
    stack: list[int] = []
    thread = None
    for pid, tid, start, end, depth in rows:
        if (pid, tid) != thread:
            stack, thread = [], (pid, tid)
        while stack and stack[-1] <= start:
            stack.pop()
        assert depth == len(stack)
        stack.append(end)


def test_profiles_kernels_join_their_launch_call(open_fixture):
    raw = _raw("nsysai_h100_2gpu_1s")
    expected = raw.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
        ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)""").fetchone()[0]
    got = open_fixture("nsysai_h100_2gpu_1s").con.execute(
        "SELECT count(*) FROM kernels WHERE launch_api IS NOT NULL").fetchone()[0]
    assert got == expected == 1632


def test_profiles_latin1_text_is_kept(open_fixture):
    con = open_fixture("extrap_windows_con_kernel").con
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 9
    assert con.execute("SELECT name FROM gpus").fetchone()[0] == "GeForce GTX 1060 with Max-Q Design"


def test_profiles_empty_export_says_no_gpu_activity(open_fixture):
    con = open_fixture("dynamicvit_empty_export").con
    assert con.execute("SELECT gpu_start_ns, capture_start_ns FROM meta").fetchone() == (None, None)
    assert con.execute("SELECT count(*) FROM capabilities WHERE present").fetchone()[0] == 0


@pytest.mark.parametrize("make, error, words", [
    (lambda d: d / "missing.sqlite", ProfileNotFound, "does not exist"),
    (lambda d: d, NotAProfile, "is a directory"),
    (lambda d: _write(d / "empty.sqlite", b""), NotAProfile, "is empty"),
    (lambda d: _write(d / "image.sqlite", b"\x89PNG\r\n\x1a\n" + b"\0" * 100), NotAProfile, "not an SQLite file"),
    (lambda d: _write(d / "cut.sqlite", (FIXTURES / "nsysai_mock.sqlite").read_bytes()[:3000]), NotAProfile,
     "not a readable SQLite database"),
    (lambda d: _plain_sqlite(d / "other.sqlite"), NotAProfile, "not an Nsight Systems export"),
    (lambda d: _write(d / "report.nsys-rep", b"nsys report bytes"), ConversionNeeded, "nsys export --type sqlite"),
])
def test_profiles_bad_input_is_one_clear_sentence(tmp_path, monkeypatch, make, error, words):
    monkeypatch.setenv("PATH", "/nonexistent")  # no nsys to convert with
    target = make(tmp_path)
    with pytest.raises(error) as caught:
        open_profile(target, cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert words in message and str(target) in message and "\n" not in message


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _plain_sqlite(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    return path


def test_profiles_cache_reuses_rebuilds_and_leaves_the_folder_alone(tmp_path):
    folder = tmp_path / "user"
    folder.mkdir()
    copy = folder / "run.sqlite"
    shutil.copy(FIXTURES / "nsysai_mock.sqlite", copy)
    cache = tmp_path / "cache"
    first = open_profile(copy, cache_dir=cache)
    first.close()
    again = open_profile(copy, cache_dir=cache)
    again.close()
    assert again.model_path == first.model_path and len(list(cache.glob("*.duckdb"))) == 1
    with sqlite3.connect(copy) as con:  # a re-export: same name, new content
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 1")
    changed = open_profile(copy, cache_dir=cache)
    assert changed.fingerprint != first.fingerprint
    assert changed.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 1
    changed.close()
    assert sorted(p.name for p in folder.iterdir()) == ["run.sqlite"]


def test_profiles_no_cache_keeps_nothing(tmp_path):
    profile = open_profile(FIXTURES / "nsysai_mock.sqlite", cache_dir=tmp_path, use_cache=False)
    assert profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 2
    profile.close()
    assert list(tmp_path.iterdir()) == [] and not profile.model_path.exists()


def _open_count(args: tuple[str, str]) -> int:
    profile = open_profile(args[0], cache_dir=Path(args[1]))
    try:
        return profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0]
    finally:
        profile.close()


def test_profiles_two_processes_open_one_profile_at_once(tmp_path):
    job = (str(FIXTURES / "nsysai_h100_2gpu_1s.sqlite"), str(tmp_path))
    with ProcessPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(_open_count, [job, job]))
    assert counts == [3442, 3442]
    assert len(list(tmp_path.glob("*.duckdb"))) == 1 and not list(tmp_path.glob("*.tmp"))


def test_profiles_wheel_installs_under_one_namespace_and_runs(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(ROOT)], check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("nsightful-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"nsightful", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True)
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(target / "bin" / "nsightful"), "tool", "top_kernels",
                           str(FIXTURES / "nsysai_mock.sqlite"), "--json", "-p", "limit=1"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert '"kernel_count": 2' in done.stdout
    book = subprocess.run([sys.executable, "-c", "import nsightful.resources.book as b; print(len(b.load_book()))"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, check=True)
    assert int(book.stdout) >= 21
