"""Ingest: every real export loads into the model, figures agree with independent SQL on the raw file,
bad inputs fail with one clear sentence, and the cache never touches the user's folder."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from conftest import FIXTURE_FILES, FIXTURE_IDS, FIXTURES
from modeldb import make_model

from stallhound.analysis import program
from stallhound.analysis.common import records
from stallhound.analysis.intervals import BUSY, GPU_WORK
from stallhound.formats import open_profile
from stallhound.formats.nsys.hardware import gpu_info_flag
from stallhound.model.errors import ConversionNeeded, NotAProfile, ProfileNotFound
from stallhound.model.schema import DEVICE_MEMORY_KINDS, PEAK_MEMORY_SQL, TABLE_NAMES


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
    meta = records(con, """SELECT nsys_version, schema_version, metadata_table, enum_source, capture_start_ns,
                           capture_end_ns, gpu_start_ns, gpu_end_ns, machine_gpus, derived_from FROM meta""", {})
    summary = {
        "meta": meta[0],
        "devices": records(con, "SELECT device_id, name, sm_count FROM gpus ORDER BY 1", {}),
        "rows": {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLE_NAMES},
        "capabilities": dict(con.execute("SELECT data, present FROM capabilities ORDER BY data").fetchall()),
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


def test_profiles_unified_memory_migrations_keep_their_cause(open_fixture):
    """clue's 500 copies are all unified-memory migrations: decoded by the export's own ENUM tables, each keeps its
    direction and the driver's reason for it; other copies have no cause."""
    raw = _raw("clue_t4_report4")
    expected = raw.execute("""SELECT o.name, c.name, count(*), sum(m.bytes), sum(m."end" - m.start)
        FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind
        JOIN ENUM_CUDA_UNIF_MEM_MIGRATION c ON c.id = m.migrationCause GROUP BY 1, 2""").fetchall()
    words = {"CUDA_MEMCPY_KIND_UVM_HTOD": "UVM_H2D", "CUDA_MEMCPY_KIND_UVM_DTOH": "UVM_D2H",
             "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_USER": "user_prefetch",
             "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE": "page_fault",
             "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_PREFETCH": "speculative_prefetch"}
    got = open_fixture("clue_t4_report4").con.execute(
        "SELECT direction, migration_cause, count(*), sum(bytes), sum(duration_ns) FROM memcpy GROUP BY 1, 2"
    ).fetchall()
    assert sorted(got) == sorted((words[o], words[c], n, b, t) for o, c, n, b, t in expected)
    assert sum(n for *_, n, _, _ in got) == 500 and {c for _, c, *_ in got} == {
        "user_prefetch", "page_fault", "speculative_prefetch"}
    other = open_fixture("pipit_saxpy_mpi_a100").con.execute(
        "SELECT count(*) FILTER (WHERE migration_cause IS NOT NULL), count(*) FROM memcpy").fetchone()
    assert other == (0, 15)


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


@pytest.mark.parametrize("stem", ["fuser_h200_crossentropy", "nsysai_mock", "nsysai_h100_2gpu_1s",
                                  "nsysai_mfu_2gpu_before", "nsysai_mfu_2gpu_after", "pipit_saxpy_mpi_a100"])
def test_profiles_diagnostics_match_raw(open_fixture, stem):
    raw = _raw(stem)
    expected = []
    if _has(raw, "DIAGNOSTIC_EVENT"):
        expected = raw.execute("""SELECT lower(sv.name), lower(so.name), count(*), count(DISTINCT d.text),
                (d.globalPid >> 24) & 16777215 = 0 FROM DIAGNOSTIC_EVENT d
            JOIN ENUM_DIAGNOSTIC_SEVERITY_LEVEL sv ON sv.id = d.severity
            JOIN ENUM_DIAGNOSTIC_SOURCE_TYPE so ON so.id = d.source GROUP BY 1, 2, 5 ORDER BY 1, 2, 5""").fetchall()
    got = open_fixture(stem).con.execute("""SELECT severity, source, count(*), count(DISTINCT text), pid IS NULL
        FROM diagnostics GROUP BY 1, 2, 5 ORDER BY 1, 2, 5""").fetchall()
    assert got == expected


def test_profiles_diagnostics_of_a_real_capture(open_fixture):
    con = open_fixture("fuser_h200_crossentropy").con
    assert con.execute("SELECT severity, count(*) FROM diagnostics GROUP BY 1 ORDER BY 1").fetchall() == [
        ("info", 27), ("warning", 31)]
    assert con.execute("""SELECT text, count(DISTINCT pid) FROM diagnostics WHERE severity = 'warning'
                          GROUP BY 1 ORDER BY 1""").fetchall() == [
        ("CUDA profiling might have not been started correctly.", 10),
        ("No CUDA events collected. Does the process use CUDA?", 10),
        ("No NVTX events collected. Does the process use NVTX?", 11)]
    first = con.execute("SELECT time_ns, severity, source, pid, text FROM diagnostics ORDER BY time_ns LIMIT 1")
    assert first.fetchone() == (0, "info", "analysis", None, "Profiling has started.")


@pytest.mark.parametrize("stem", ["extrap_windows_con_kernel", "pipit_saxpy_mpi_a100"])
def test_profiles_memory_usage_matches_raw(open_fixture, stem):
    raw = _raw(stem)
    # neither export has ENUM_CUDA_DEV_MEM_EVENT_OPER/ENUM_CUDA_MEM_KIND; the schema comments say 0 = allocated,
    # 1 = deallocated, and memKind follows CUDA_MEMOPR_MEMORY_KIND (1 pinned, 2 device)
    operation, kind = {0: "allocation", 1: "deallocation"}, {1: "pinned", 2: "device"}
    expected = sorted((operation[o], kind[k], n, b) for o, k, n, b in raw.execute(
        """SELECT memoryOperationType, memKind, count(*), sum(bytes) FROM CUDA_GPU_MEMORY_USAGE_EVENTS
           GROUP BY 1, 2""").fetchall())
    got = open_fixture(stem).con.execute("""SELECT operation, mem_kind, count(*), sum(bytes) FROM memory_usage
                                            GROUP BY 1, 2 ORDER BY 1, 2""").fetchall()
    assert got == expected
    assert len(got) == (4 if stem == "extrap_windows_con_kernel" else 0)


def test_profiles_peak_memory_is_the_running_sum(open_fixture):
    raw = _raw("extrap_windows_con_kernel")
    in_use = peak = 0
    when = None
    for time, op, nbytes in raw.execute("""SELECT start, memoryOperationType, bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS
                                           WHERE memKind = 2 ORDER BY start, memoryOperationType DESC"""):
        in_use += -nbytes if op else nbytes
        if in_use > peak:
            peak, when = in_use, time
    got = open_fixture("extrap_windows_con_kernel").con.execute(
        PEAK_MEMORY_SQL, {"kinds": list(DEVICE_MEMORY_KINDS)}).fetchall()
    assert got == [(0, peak, when)] and peak == 40_160_000


def test_profiles_gpu_info_of_a_derived_export_names_no_wrong_remedy(open_fixture):
    flag = open_fixture("nsysai_h100_2gpu_1s").con.execute(
        "SELECT present, capture_flag FROM capabilities WHERE data = 'gpu_info'").fetchone()
    assert flag == (False, "2 of 2 devices have no hardware record in the export, so their GPU model is unknown; "
                           "this export is a derived copy (perf_h100_sp2_fa3.sqlite by scripts/derive_test_fixture.py, "
                           "window 155330248986-156330248986 ns): the original export may hold it")


@pytest.mark.parametrize("version, derived, devices, named, words, remedy", [
    ("2026.2.1.210", None, 2, 0, "nsys 2026.2.1.210 writes TARGET_INFO_GPU when it can query the GPUs, and no option",
     False),
    ("2025.3.2.0", None, 2, 1, "1 of 2 devices have no hardware record", False),
    ("2021.1.1.66", None, 1, 0, "predates TARGET_INFO_GPU: a newer nsys (2021.2+) records it", True),
    ("2020.3.1", None, 1, 0, "a newer nsys (2021.2+)", True),
    (None, None, 1, 0, "does not record its nsys version either", False),
    ("2026.2.1.210", "big.sqlite by cut.py", 1, 0, "derived copy (big.sqlite by cut.py)", False),
    ("2025.3.2.0", None, 0, 0, "no GPU work was recorded", False),
    ("2025.3.2.0", None, 1, 1, "recorded", False),
])
def test_profiles_gpu_info_advice_by_nsys_version(version, derived, devices, named, words, remedy):
    flag = gpu_info_flag(version, derived, devices, named)
    assert words in flag
    assert ("newer nsys" in flag) is remedy


def test_profiles_graph_executions_are_gpu_work():
    con = make_model(
        kernels=[{"device_id": 0, "stream_id": 7, "start_ns": 0, "end_ns": 100}],
        graph_exec=[{"device_id": 0, "stream_id": 13, "start_ns": s, "end_ns": e, "graph_id": 1, "graph_exec_id": 2}
                    for s, e in ((50, 150), (300, 400))]
        + [{"device_id": 1, "stream_id": 13, "start_ns": 500, "end_ns": 600, "graph_id": 1, "graph_exec_id": 3}])
    busy = con.execute("WITH " + BUSY + " SELECT device_id, start_ns, end_ns FROM busy ORDER BY 1, 2",
                       {"start": 0, "end": 550, "devices": [0, 1]}).fetchall()
    assert busy == [(0, 0, 150), (0, 300, 400), (1, 500, 550)]
    kinds = con.execute("WITH " + GPU_WORK + " SELECT kind, count(*) FROM gpu_work GROUP BY 1 ORDER BY 1",
                        {"start": 0, "end": 550, "devices": [0]}).fetchall()
    assert kinds == [("graph", 2), ("kernel", 1)]
    assert con.execute("SELECT device_id FROM gpus ORDER BY 1").fetchall() == [(0,), (1,)]
    assert con.execute("SELECT gpu_start_ns, gpu_end_ns FROM meta").fetchone() == (0, 600)


# --- tiny hand-written exports: tables no fixture holds ----------------------------------------------
def _export(path: Path, tables: dict[str, tuple[str, list[tuple]]], strings: list[tuple[int, str]] = ()) -> Path:
    """An SQLite file with the given (columns DDL, rows) per table, plus the StringIds every export has."""
    con = sqlite3.connect(path)
    for name, (columns, rows) in {"StringIds": ("id INTEGER PRIMARY KEY, value TEXT NOT NULL", list(strings)),
                                  **tables}.items():
        con.execute(f"CREATE TABLE {name} ({columns})")
        if rows:
            con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    con.commit()
    con.close()
    return path


GPID = (1 << 48) + (4300 << 24)  # globalPid of pid 4300; its main thread has tid 4300
RUNTIME = ("start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, nameId INTEGER, "
           "returnValue INTEGER, callchainId INTEGER")
GRAPH_TRACE = ("start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER, greenContextId INTEGER, "
               "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, graphId INTEGER, graphExecId INTEGER")


def test_profiles_graph_executions_become_gpu_work(tmp_path):
    path = _export(tmp_path / "graphs.sqlite", {
        "CUPTI_ACTIVITY_KIND_RUNTIME": (RUNTIME, [(100, 110, 1, GPID + 4300, 7, 2, 0, None)]
                                        + [(200 + 100 * i, 210 + 100 * i, 1, GPID + 4300, 8 + i, 1, 0, None)
                                           for i in range(3)]),
        "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": (GRAPH_TRACE, [(220 + 100 * i, 290 + 100 * i, 0, 1, 0, 13, 8 + i, GPID, 1, 2)
                                                          for i in range(3)]),
    }, strings=[(1, "cudaGraphLaunch_v10000"), (2, "cudaGraphInstantiate_v12000")])
    profile = open_profile(path, cache_dir=tmp_path / "cache")
    con = profile.con
    assert con.execute("SELECT * FROM graph_exec ORDER BY start_ns").fetchall() == [
        (0, 1, 13, 4300, 4300, 8 + i, 220 + 100 * i, 290 + 100 * i, 70, 1, 2, "cudaGraphLaunch", 200 + 100 * i,
         210 + 100 * i) for i in range(3)]
    assert con.execute("SELECT device_id, name FROM gpus").fetchall() == [(0, None)]
    assert con.execute("SELECT gpu_start_ns, gpu_end_ns FROM meta").fetchone() == (220, 490)
    assert con.execute("SELECT present, rows FROM capabilities WHERE data = 'graph_exec'").fetchone() == (True, 3)
    profile.close()


def test_profiles_uvm_faults_and_old_gpu_table(tmp_path):
    path = _export(tmp_path / "uvm.sqlite", {
        "CUDA_UM_CPU_PAGE_FAULT_EVENTS": ("start INTEGER, globalPid INTEGER, address INTEGER, originalFaultPc INTEGER, "
                                          "CpuInstruction INTEGER, module INTEGER, unresolvedFaultPc INTEGER",
                                          [(50, GPID, 4096, None, 0, 0, None), (60, GPID, 8192, None, 0, 0, None)]),
        "CUDA_UM_GPU_PAGE_FAULT_EVENTS": ("start INTEGER, end INTEGER, globalPid INTEGER, deviceId INTEGER, "
                                          "address INTEGER, numberOfPageFaults INTEGER, faultAccessType INTEGER",
                                          [(70, 90, GPID, 1, 4096, 5, 1)]),
        "CUPTI_ACTIVITY_KIND_MEMSET": ("start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER, "
                                       "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, value INTEGER, "
                                       "bytes INTEGER, memKind INTEGER", [(10, 20, 1, 1, 7, 3, GPID, 0, 64, 2)]),
        # the pre-2021.2 hardware table, keyed by the CUDA device id
        "TARGET_INFO_CUDA_GPU": ("deviceId INTEGER, name TEXT, numMultiprocessors INTEGER, globalMemorySize INTEGER, "
                                 "computeCapabilityMajor INTEGER, computeCapabilityMinor INTEGER",
                                 [(0, "Tesla V100-SXM2-16GB", 80, 16_000_000_000, 7, 0),
                                  (1, "Tesla T4", 40, 15_000_000_000, 7, 5)]),
    })
    profile = open_profile(path, cache_dir=tmp_path / "cache")
    con = profile.con
    assert con.execute("SELECT * FROM uvm_faults ORDER BY start_ns").fetchall() == [
        ("cpu", None, 4300, 50, None, 4096, 1), ("cpu", None, 4300, 60, None, 8192, 1),
        ("gpu", 1, 4300, 70, 90, 4096, 5)]
    assert con.execute("SELECT device_id, name, sm_count, memory_bytes, compute_capability FROM gpus").fetchall() == [
        (1, "Tesla T4", 40, 15_000_000_000, "7.5")]
    assert con.execute("SELECT machine_gpus FROM meta").fetchone() == ("Tesla V100-SXM2-16GB, Tesla T4",)
    assert con.execute("SELECT data, present, rows FROM capabilities WHERE data IN ('uvm_faults', 'gpu_info') "
                       "ORDER BY 1").fetchall() == [("gpu_info", True, 1), ("uvm_faults", True, 3)]
    profile.close()


def test_profiles_openacc_and_library_calls_become_library_api_rows(tmp_path):
    """Columns as nsys writes them (the OpenACC tables' extra columns left out); an OpenACC-traced run of an OpenACC
    program is an offload program even when no kernel name says so."""
    acc = "start INTEGER, end INTEGER, eventKind INTEGER, globalTid INTEGER, nameId INTEGER, lineNo INTEGER"
    path = _export(tmp_path / "acc.sqlite", {
        "CUPTI_ACTIVITY_KIND_OPENACC_LAUNCH": (acc, [(100, 130, 11, GPID + 4301, 1, 42)]),
        "CUPTI_ACTIVITY_KIND_OPENACC_DATA": (acc, [(90, 95, 8, GPID + 4301, 2, 40)]),
        "CUBLAS_EVENTS": ("start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER, nameId INTEGER",
                          [(200, 260, 1, GPID + 4300, 3)]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (RUNTIME, [(100, 110, 1, GPID + 4300, 7, 4, 0, None)]),
    }, strings=[(1, "acc_enqueue_launch"), (2, "acc_enqueue_upload"), (3, "cublasSgemm_v2"), (4, "cuLaunchKernel")])
    profile = open_profile(path, cache_dir=tmp_path / "cache")
    con = profile.con
    assert con.execute("SELECT * FROM library_api ORDER BY start_ns").fetchall() == [
        (4300, 4301, "openacc", "acc_enqueue_upload", 90, 95, 5),
        (4300, 4301, "openacc", "acc_enqueue_launch", 100, 130, 30),
        (4300, 4300, "cublas", "cublasSgemm_v2", 200, 260, 60)]
    assert program.detect(con).kind == "offload"
    profile.close()


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


def test_profiles_cli_output_cut_short_by_the_reader_ends_quietly():
    """`stallhound tools | head -1`: the reader leaves early; the CLI exits without a traceback."""
    cli = Path(sys.executable).parent / "stallhound"
    proc = subprocess.Popen([str(cli), "tools"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the CLI has started to write
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in stderr, stderr


def test_profiles_host_modules_count_the_call_stacks_through_each_module(open_fixture):
    """pipit has all three kinds of call stacks: CPU samples, OS runtime calls and CUDA API calls."""
    con = open_fixture("pipit_saxpy_mpi_a100").con
    with _raw("pipit_saxpy_mpi_a100") as raw:
        expected = raw.execute("""
            SELECT pid, s.value, count(*) FROM (
              SELECT DISTINCT (e.globalTid >> 24) & 16777215 AS pid, 'cpu', c.id, c.module FROM SAMPLING_CALLCHAINS c
                JOIN COMPOSITE_EVENTS e ON e.id = c.id
              UNION ALL SELECT DISTINCT (o.globalTid >> 24) & 16777215, 'osrt', c.id, c.module FROM OSRT_CALLCHAINS c
                JOIN OSRT_API o ON o.callchainId = c.id
              UNION ALL SELECT DISTINCT (o.globalTid >> 24) & 16777215, 'cuda', c.id, c.module FROM CUDA_CALLCHAINS c
                JOIN CUPTI_ACTIVITY_KIND_RUNTIME o ON o.callchainId = c.id) x
            JOIN StringIds s ON s.id = x.module GROUP BY 1, 2 ORDER BY 1, 2""").fetchall()
    assert con.execute("SELECT pid, module, stacks FROM host_modules ORDER BY 1, 2").fetchall() == expected
    assert len(expected) == 19 and any("saxpy-mpi-cuda" in m for _, m, _ in expected)
