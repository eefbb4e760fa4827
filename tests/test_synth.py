"""The synthetic export generator: every planted problem is in the file exactly as the truth says.

Checks run raw SQL through the stdlib sqlite3 on the written file, never through stallhound's own
reader, so that a bug in the generator cannot hide behind the same bug in the nsys build.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import statistics
import time
from pathlib import Path

import pytest

from stallhound import synth
from stallhound.cli import main as cli_main

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "nsys"
REAL_2025 = FIXTURES / "fuser_h200_crossentropy.sqlite"  # nsys 2025.1.1, the version the generator mimics
REAL_OSRT = FIXTURES / "clue_t4_report4.sqlite"  # has OSRT_API
GAP_MIN_NS = 1_000_000
TINY_MAX_NS = 10_000
PLANTED_KINDS = {"idle_gap", "slow_first_iteration", "tiny_kernels", "pageable_h2d", "device_sync",
                 "small_d2h", "nccl_straggler", "gc_pause"}
GPU_OPS_SQL = """
    SELECT deviceId, streamId, start, end, 'kernel' AS kind FROM CUPTI_ACTIVITY_KIND_KERNEL
    UNION ALL SELECT deviceId, streamId, start, end, 'memcpy' FROM CUPTI_ACTIVITY_KIND_MEMCPY
    UNION ALL SELECT deviceId, streamId, start, end, 'memset' FROM CUPTI_ACTIVITY_KIND_MEMSET"""


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


@pytest.fixture(scope="module")
def demo_sample(tmp_path_factory) -> tuple[Path, dict, float]:
    path = tmp_path_factory.mktemp("synth-demo") / "demo.sqlite"
    started = time.perf_counter()
    truth = synth.write_sample(path, synth.demo())
    return path, truth, time.perf_counter() - started


@pytest.fixture(scope="module")
def demo(demo_sample) -> tuple[sqlite3.Connection, dict]:
    con = _connect(demo_sample[0])
    yield con, demo_sample[1]
    con.close()


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[sqlite3.Connection, dict]:
    path = tmp_path_factory.mktemp("synth-clean") / "clean.sqlite"
    truth = synth.write_sample(path, synth.clean())
    con = _connect(path)
    yield con, truth
    con.close()


def _planted(truth: dict, kind: str) -> list[dict]:
    return [p for p in truth["planted"] if p["kind"] == kind]


def _pid(truth: dict, device: int) -> int:
    return truth["pids"][truth["devices"].index(device)]


def _global_tid(truth: dict, device: int) -> int:
    return next(r["global_tid"] for r in truth["ranks"] if r["device"] == device)


def _overlapping_ops(con: sqlite3.Connection, device: int, start: int, end: int) -> int:
    return con.execute(f"SELECT count(*) FROM ({GPU_OPS_SQL}) WHERE deviceId = ? AND start < ? AND end > ?",
                       (device, end, start)).fetchone()[0]


def _idle_windows(con: sqlite3.Connection, device: int) -> list[tuple[int, int]]:
    """Windows in which no op of the device runs, between its first and last op."""
    rows = con.execute(f"""
        SELECT prev_end, start FROM (
          SELECT start, max(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                 AS prev_end
          FROM ({GPU_OPS_SQL}) WHERE deviceId = ?)
        WHERE start > prev_end ORDER BY start""", (device,)).fetchall()
    return [tuple(r) for r in rows]


def _table_info(path: Path, table: str) -> list[tuple[str, str, int, int]]:
    con = _connect(path)
    try:
        return [(name, typ, notnull, pk) for _, name, typ, notnull, _, pk in
                con.execute(f"PRAGMA table_info({table})")]
    finally:
        con.close()


def test_synth_writes_truth_beside_the_export(demo_sample):
    path, truth, seconds = demo_sample
    on_disk = json.loads(Path(f"{path}.truth.json").read_text())
    assert on_disk == json.loads(json.dumps(truth))
    assert on_disk["generator"] == "stallhound.synth"
    assert on_disk["devices"] == [0, 1, 2, 3] and len(set(on_disk["pids"])) == 4
    assert len(on_disk["iterations"]) == 12
    assert {p["kind"] for p in on_disk["planted"]} == PLANTED_KINDS
    for entry in on_disk["planted"]:
        assert {"kind", "device", "start_ns", "end_ns", "duration_ns", "count", "bytes"} <= set(entry)
        assert entry["duration_ns"] == entry["end_ns"] - entry["start_ns"] >= 0
    assert seconds < 2.0, f"the demo took {seconds:.2f} s to write"
    assert path.stat().st_size < 5_000_000


def test_synth_schema_matches_a_real_2025_export(demo_sample):
    path = demo_sample[0]
    before = hashlib.sha256(REAL_2025.read_bytes()).hexdigest()
    con = _connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
    required = {"StringIds", "ThreadNames", "PROCESSES", "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE",
                "META_DATA_EXPORT", "META_DATA_CAPTURE", "TARGET_INFO_SESSION_START_TIME",
                "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "ENUM_CUPTI_SYNC_TYPE",
                "ENUM_CUDA_KERNEL_LAUNCH_TYPE", "ENUM_NSYS_EVENT_TYPE", "CUPTI_ACTIVITY_KIND_KERNEL",
                "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME",
                "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "OSRT_API"}
    assert tables == required
    for table in sorted(tables - {"OSRT_API"}):
        assert _table_info(path, table) == _table_info(REAL_2025, table), table
    assert _table_info(path, "OSRT_API") == _table_info(REAL_OSRT, "OSRT_API")
    assert hashlib.sha256(REAL_2025.read_bytes()).hexdigest() == before


def test_synth_enum_tables_hold_the_real_codes(demo):
    con = demo[0]
    real = _connect(REAL_2025)
    try:
        for table in ("ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "ENUM_CUPTI_SYNC_TYPE",
                      "ENUM_CUDA_KERNEL_LAUNCH_TYPE", "ENUM_NSYS_EVENT_TYPE"):
            query = f"SELECT id, name, label FROM {table} ORDER BY id"
            assert con.execute(query).fetchall() == real.execute(query).fetchall(), table
    finally:
        real.close()


def test_synth_metadata_and_devices(demo):
    con, truth = demo
    meta = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))
    assert meta["EXPORT_PRODUCT_VERSION"].startswith("2025.1.1")
    assert meta["EXPORT_SCHEMA_VERSION"].startswith("3.17.")
    assert meta["EXPORT_PLATFORM"] == "linux-desktop" and meta["EXPORT_HOST"]
    capture = dict(con.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_0:%'"))
    assert capture["PROCESS_0:COMMAND"] == "torchrun" and "PROCESS_0:ARGUMENT_0" in capture
    mapping = con.execute("""
        SELECT c.cudaId, c.pid, g.name, g.smCount FROM TARGET_INFO_CUDA_DEVICE c
        JOIN TARGET_INFO_GPU g ON g.id = c.gpuId ORDER BY c.cudaId""").fetchall()
    assert [(d, pid) for d, pid, _, _ in mapping] == list(zip(truth["devices"], truth["pids"], strict=True))
    assert {(name, sms) for _, _, name, sms in mapping} == {("NVIDIA H100 80GB HBM3", 132)}
    kernel_devices = [r[0] for r in con.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                                "ORDER BY 1")]
    assert kernel_devices == truth["devices"]


def test_synth_global_ids_encode_pid_and_tid(demo):
    con, truth = demo
    processes = dict(con.execute("SELECT pid, globalPid FROM PROCESSES"))
    for pid in truth["pids"]:
        assert processes[pid] == (1 << 48) | (pid << 24)
    threads = con.execute("""
        SELECT DISTINCT (globalTid >> 24) & 16777215, globalTid & 16777215, globalTid >> 48
        FROM CUPTI_ACTIVITY_KIND_RUNTIME""").fetchall()
    assert sorted(threads) == sorted((pid, pid, 1) for pid in truth["pids"])
    names = con.execute("""
        SELECT s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId
        WHERE t.globalTid IN (SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME)""")
    assert {r[0] for r in names} == {"pt_main_thread"}


@pytest.mark.parametrize("table", ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                                   "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"])
def test_synth_gpu_rows_join_runtime_one_to_one(demo, table):
    con = demo[0]
    duplicates = con.execute("""SELECT count(*) FROM (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME
                                GROUP BY globalTid >> 24, correlationId HAVING count(*) > 1)""").fetchone()[0]
    assert duplicates == 0
    rows, joined, same_thread = con.execute(f"""
        SELECT count(*), count(r.correlationId), count(DISTINCT r.globalTid)
        FROM {table} g LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
          ON r.correlationId = g.correlationId AND r.globalTid >> 24 = g.globalPid >> 24""").fetchone()
    assert rows > 0 and joined == rows
    assert same_thread == 4


def test_synth_launch_calls_end_before_their_kernels(demo):
    con = demo[0]
    apis = con.execute("""
        SELECT s.value, count(*), sum(r.end >= k.start), min(k.start - r.end)
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
             AND r.globalTid >> 24 = k.globalPid >> 24
        JOIN StringIds s ON s.id = r.nameId GROUP BY 1""").fetchall()
    assert {a[0] for a in apis} == {"cudaLaunchKernel_v7000", "cuLaunchKernelEx", "cuLaunchKernel"}
    assert all(late == 0 and gap > 0 for _, _, late, gap in apis)


def test_synth_streams_never_run_two_ops_at_once(demo):
    overlaps = demo[0].execute(f"""
        SELECT count(*) FROM (
          SELECT start, lag(end) OVER (PARTITION BY deviceId, streamId ORDER BY start) AS prev_end
          FROM ({GPU_OPS_SQL})) WHERE start < prev_end""").fetchone()[0]
    assert overlaps == 0


def test_synth_idle_gaps_are_exact(demo):
    con, truth = demo
    gaps = _planted(truth, "idle_gap")
    assert {(g["device"], g["iteration"], g["duration_ns"]) for g in gaps} == {(0, 5, 20_000_000),
                                                                             (1, 8, 12_000_000)}
    for gap in gaps:
        device, start, end = gap["device"], gap["start_ns"], gap["end_ns"]
        assert _overlapping_ops(con, device, start, end) == 0
        assert con.execute(f"SELECT count(*) FROM ({GPU_OPS_SQL}) WHERE deviceId = ? AND end = ?",
                           (device, start)).fetchone()[0] >= 1
        assert con.execute(f"SELECT count(*) FROM ({GPU_OPS_SQL}) WHERE deviceId = ? AND start = ?",
                           (device, end)).fetchone()[0] == 1
        host = (_global_tid(truth, device), gap["host_end_ns"], gap["host_start_ns"])
        cuda_calls = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid = ? "
                                 "AND start < ? AND end > ?", host).fetchone()[0]
        polls = con.execute("""SELECT s.value FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId
                               WHERE o.globalTid = ? AND o.start < ? AND o.end > ?""", host).fetchall()
        assert cuda_calls == 0
        assert polls == ([("poll",)] if gap["host_activity"] == "os_runtime:poll" else [])


def test_synth_slow_first_iteration(demo):
    con, truth = demo
    slow = _planted(truth, "slow_first_iteration")
    assert [s["device"] for s in slow] == truth["devices"]
    for entry in slow:
        gtid = _global_tid(truth, entry["device"])
        ranges = con.execute("""SELECT text, end - start FROM NVTX_EVENTS WHERE globalTid = ?
                                AND eventType = 59 AND text LIKE 'iteration %'
                                ORDER BY start""", (gtid,)).fetchall()
        assert ranges[0][0] == "iteration 0" and ranges[0][1] == entry["duration_ns"]
        assert ranges[0][1] > 2 * statistics.median(d for _, d in ranges[1:])
        loads = con.execute("""
            SELECT count(*), sum(r.end - r.start), min(r.start) >= ?, max(r.end) <= ?
            FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
            WHERE s.value = 'cuModuleLoadData' AND r.globalTid = ?""",
                            (entry["start_ns"], entry["end_ns"], gtid)).fetchone()
        assert loads == (entry["count"], entry["module_load_ns"], 1, 1)


def test_synth_tiny_kernels_in_the_optimizer(demo):
    con, truth = demo
    for entry in _planted(truth, "tiny_kernels"):
        gtid = _global_tid(truth, entry["device"])
        count, total, inside = con.execute("""
            SELECT count(*), sum(k.end - k.start), sum(EXISTS (
                SELECT 1 FROM NVTX_EVENTS n WHERE n.globalTid = r.globalTid AND n.text = 'optimizer'
                AND n.start <= r.start AND r.end <= n.end))
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
              ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24
            WHERE k.deviceId = ? AND r.globalTid = ? AND k.end - k.start < ?""",
                                            (entry["device"], gtid, TINY_MAX_NS)).fetchone()
        assert count == entry["count"] == inside == 300 * 12
        assert total == entry["kernel_time_ns"]


def test_synth_pageable_h2d_copies(demo):
    con, truth = demo
    for entry in _planted(truth, "pageable_h2d"):
        by_kind = dict((kind, (n, b)) for kind, n, b in con.execute("""
            SELECT e.name, count(*), sum(m.bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
            JOIN ENUM_CUDA_MEM_KIND e ON e.id = m.srcKind
            JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind
            WHERE o.name = 'CUDA_MEMCPY_KIND_HTOD' AND m.deviceId = ? GROUP BY 1""", (entry["device"],)))
        assert by_kind == {"CUDA_MEMOPR_MEMORY_KIND_PAGEABLE": (entry["count"], entry["bytes"]),
                           "CUDA_MEMOPR_MEMORY_KIND_PINNED": (entry["pinned_count"], entry["pinned_bytes"])}


def test_synth_device_syncs(demo):
    con, truth = demo
    for entry in _planted(truth, "device_sync"):
        calls, context_syncs = con.execute("""
            SELECT count(*), count(y.correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
            JOIN StringIds s ON s.id = r.nameId
            LEFT JOIN CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y ON y.correlationId = r.correlationId
                 AND y.globalPid >> 24 = r.globalTid >> 24
                 AND y.syncType = (SELECT id FROM ENUM_CUPTI_SYNC_TYPE WHERE label = 'Context sync')
            WHERE s.value LIKE 'cudaDeviceSynchronize%' AND r.globalTid = ?""",
                                           (_global_tid(truth, entry["device"]),)).fetchone()
        assert calls == context_syncs == entry["count"] == 12


def test_synth_small_d2h_copies_are_followed_by_a_stream_sync(demo):
    con, truth = demo
    for entry in _planted(truth, "small_d2h"):
        gtid = _global_tid(truth, entry["device"])
        copies = con.execute("""
            SELECT m.bytes, (SELECT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME n
                             JOIN StringIds s ON s.id = n.nameId
                             WHERE n.globalTid = r.globalTid AND n.start >= r.end ORDER BY n.start LIMIT 1)
            FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
              ON r.correlationId = m.correlationId AND r.globalTid >> 24 = m.globalPid >> 24
            WHERE m.copyKind = 2 AND m.bytes <= 8 AND r.globalTid = ?""", (gtid,)).fetchall()
        assert len(copies) == entry["count"] == 24
        assert sum(b for b, _ in copies) == entry["bytes"]
        assert {api for _, api in copies} == {"cudaStreamSynchronize_v3020"}


def test_synth_nccl_straggler_makes_its_peers_wait(demo):
    con, truth = demo
    (entry,) = _planted(truth, "nccl_straggler")
    straggler, delay = entry["device"], entry["delay_ns"]
    assert straggler == 2 and entry["peer_devices"] == [0, 1, 3]
    kernels = {device: con.execute("""
        SELECT k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
        WHERE s.value = 'ncclDevKernel_AllReduce_Sum_f32_RING_LL' AND k.deviceId = ? ORDER BY k.start""",
                                   (device,)).fetchall() for device in truth["devices"]}
    assert {len(k) for k in kernels.values()} == {2 * len(truth["iterations"])}  # two buckets per step
    delayed, extra = [], []
    for index, ops in enumerate(zip(*(kernels[d] for d in truth["devices"]), strict=True)):
        mine = ops[straggler]
        peers = [op for device, op in enumerate(ops) if device != straggler]
        if mine[0] - max(start for start, _ in peers) >= delay / 2:
            delayed.append([index // 2, index % 2])
            extra.append(statistics.mean(e - s for s, e in peers) - (mine[1] - mine[0]))
    assert delayed == entry["delayed"] and len(delayed) == entry["count"] >= len(truth["iterations"])
    assert abs(statistics.median(extra) - delay) < 0.15 * delay


def test_synth_gc_pauses_leave_the_host_silent(demo):
    con, truth = demo
    pauses = _planted(truth, "gc_pause")
    assert sorted({p["iteration"] for p in pauses}) == [3, 6, 9] and len(pauses) == 12
    for pause in pauses:
        gtid, start, end = _global_tid(truth, pause["device"]), pause["start_ns"], pause["end_ns"]
        for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API"):
            assert con.execute(f"SELECT count(*) FROM {table} WHERE globalTid = ? AND start < ? AND end > ?",
                               (gtid, end, start)).fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE globalTid = ? AND "
                           "(start > ? AND start < ? OR end > ? AND end < ?)",
                           (gtid, start, end, start, end)).fetchone()[0] == 0
        gpu = (pause["gpu_idle_start_ns"], pause["gpu_idle_end_ns"])
        assert gpu in _idle_windows(con, pause["device"])
        assert gpu[1] - gpu[0] >= 0.8 * pause["duration_ns"]


def test_synth_every_long_gpu_gap_is_explained(demo):
    con, truth = demo
    for device in truth["devices"]:
        found = [w for w in _idle_windows(con, device) if w[1] - w[0] >= GAP_MIN_NS]
        listed = [(g["start_ns"], g["end_ns"]) for g in truth["gpu_gaps"] if g["device"] == device]
        assert found == listed
    assert all(gap["causes"] for gap in truth["gpu_gaps"])


def test_synth_clean_keeps_every_gpu_busy(clean):
    con, truth = clean
    assert truth["planted"] == [] and truth["gpu_gaps"] == []
    for device in truth["devices"]:
        first, last = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                  "WHERE deviceId = ?", (device,)).fetchone()
        long_gaps = [w for w in _idle_windows(con, device)
                     if w[0] >= first and w[1] <= last and w[1] - w[0] >= GAP_MIN_NS]
        assert long_gaps == [], device
    host_syncs = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y "
                             "JOIN ENUM_CUPTI_SYNC_TYPE e ON e.id = y.syncType "
                             "WHERE e.label IN ('Stream sync', 'Context sync')").fetchone()[0]
    pageable = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEM_KIND e "
                           "ON e.id = m.srcKind WHERE e.label = 'Pageable'").fetchone()[0]
    assert host_syncs == pageable == 0


def test_synth_totals_match_the_tables(demo):
    con, truth = demo
    totals = truth["totals"]
    for per_device in totals["per_device"]:
        count, busy = con.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                  "WHERE deviceId = ?", (per_device["device"],)).fetchone()
        assert (count, busy) == (per_device["kernels"], per_device["kernel_time_ns"])
    by_direction = dict(con.execute("""SELECT o.label, sum(m.bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
                                      JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind GROUP BY 1"""))
    assert by_direction == {"Host-to-Device": totals["memcpy_bytes_by_direction"]["H2D"],
                            "Device-to-Host": totals["memcpy_bytes_by_direction"]["D2H"]}
    first, last = con.execute(f"""SELECT min(s), max(e) FROM (
        SELECT start AS s, end AS e FROM CUPTI_ACTIVITY_KIND_RUNTIME UNION ALL SELECT start, end FROM OSRT_API
        UNION ALL SELECT start, coalesce(end, start) FROM NVTX_EVENTS
        UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION
        UNION ALL SELECT start, end FROM ({GPU_OPS_SQL}))""").fetchone()
    assert (first, last) == (truth["capture_start_ns"], truth["capture_end_ns"])


def test_synth_nvtx_iterations_nest_their_phases(demo):
    con, truth = demo
    for device in truth["devices"]:
        gtid = _global_tid(truth, device)
        outside = con.execute("""
            SELECT count(*) FROM NVTX_EVENTS p WHERE p.globalTid = ? AND p.eventType = 59
              AND p.text IN ('dataloader', 'forward', 'backward', 'optimizer') AND NOT EXISTS (
                SELECT 1 FROM NVTX_EVENTS i WHERE i.globalTid = p.globalTid AND i.text LIKE 'iteration %'
                AND i.start < p.start AND p.end < i.end)""", (gtid,)).fetchone()[0]
        phases = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE globalTid = ? AND eventType = 59 "
                             "AND text IN ('dataloader', 'forward', 'backward', 'optimizer')",
                             (gtid,)).fetchone()[0]
        assert outside == 0 and phases == 4 * len(truth["iterations"])
        nccl = con.execute("""SELECT count(*) FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId
                              WHERE n.globalTid = ? AND n.domainId != 0 AND s.value = 'ncclAllReduce'""",
                           (gtid,)).fetchone()[0]
        assert nccl == 2 * len(truth["iterations"])


def test_synth_same_seed_same_file(tmp_path):
    config = synth.demo(devices=2, iterations=3)
    synth.write_sample(tmp_path / "a.sqlite", config)
    synth.write_sample(tmp_path / "b.sqlite", config)
    synth.write_sample(tmp_path / "c.sqlite", synth.demo(devices=2, iterations=3, seed=1))
    digest = {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
              for name in ("a.sqlite", "b.sqlite", "c.sqlite")}
    assert digest["a.sqlite"] == digest["b.sqlite"] != digest["c.sqlite"]
    assert (tmp_path / "a.sqlite.truth.json").read_text() == (tmp_path / "b.sqlite.truth.json").read_text()


def _content_digest(path: Path) -> str:
    """SHA-256 of every table's name and rows, in file order: the content, whatever SQLite's page layout."""
    digest = hashlib.sha256()
    con = _connect(path)
    try:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall():
            digest.update(table.encode())
            for row in con.execute(f"SELECT * FROM {table} ORDER BY rowid"):
                digest.update(repr(row).encode())
    finally:
        con.close()
    return digest.hexdigest()


# (config, content digest, truth JSON digest) as written by synth.py before it became a package, with the project's
# new name in EXPORT_HOST and the truth's generator (the old digests came back with the old two names restored):
# a refactoring of the generator must not change one row or one truth value.
WRITTEN_BEFORE_THE_SPLIT = [
    (lambda: synth.demo(devices=2, iterations=4),
     "c7b3e3eed6f20121533a5aba721fa089253e8c85e96f99d6f7bb58b3c28f117e",
     "28211f915648bd83095f9ee51df589081e05c424f2cd1a66b9c900f85b584319"),
    (lambda: synth.SynthConfig(devices=2, iterations=4, pageable_h2d_per_iteration=2, pin_pageable_h2d=True,
                               small_d2h_per_iteration=1, tiny_kernels_per_iteration=30, seed=3),
     "e7803ac503686152328926d83642bd0af84d80236af83b6d8688ad07b4348cb3",
     "3858ab51f603ffce1aa8bd042275f868211c4cda54474910410ebb939a5b3835"),
]


@pytest.mark.parametrize(("config", "content", "truth"), WRITTEN_BEFORE_THE_SPLIT, ids=["demo", "pinned_fix"])
def test_synth_writes_table_for_table_what_the_single_module_wrote(tmp_path, config, content, truth):
    path = tmp_path / "sample.sqlite"
    synth.write_sample(path, config())
    assert _content_digest(path) == content
    assert hashlib.sha256(synth.truth_path(path).read_bytes()).hexdigest() == truth


def test_synth_refuses_to_overwrite_a_foreign_file(tmp_path):
    foreign = tmp_path / "report.sqlite"
    foreign.write_bytes(b"not ours")
    with pytest.raises(FileExistsError):
        synth.write_sample(foreign, synth.clean(devices=1, iterations=1))
    assert foreign.read_bytes() == b"not ours"
    synth.write_sample(foreign, synth.clean(devices=1, iterations=1), force=True)
    ours = synth.write_sample(foreign, synth.clean(devices=2, iterations=1))  # its own file: replaced
    assert ours["devices"] == [0, 1]


def test_synth_rejects_an_impossible_config():
    with pytest.raises(ValueError, match="idle gap"):
        synth.SynthConfig(devices=2, iterations=4, idle_gaps=(synth.IdleGap(3, 1, 20_000_000),))
    with pytest.raises(ValueError, match="straggler"):
        synth.SynthConfig(devices=1, straggler_device=0)


def test_synth_cli_writes_and_says_so(tmp_path, capsys):
    parser = cli_main.parser()
    out = tmp_path / "cli.sqlite"
    args = parser.parse_args(["synth", str(out), "--preset", "clean", "--devices", "2", "--iterations", "2"])
    assert synth.run_cli(args) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and str(out) in printed[0]
    truth = json.loads(Path(f"{out}.truth.json").read_text())
    assert truth["preset"] == "clean" and len(truth["iterations"]) == 2
    assert synth.run_cli(parser.parse_args(["synth", str(tmp_path), "--preset", "demo"])) != 0
