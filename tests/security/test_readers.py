"""Issue 30, items 6-8: hostile nsys exports and job folders over a real MCP client. A recursive view where an
activity table belongs, a 50 MB name shared by every kernel, a JSON bomb lying in a job's folder, and more
workers than cores each end promptly, within memory, in one sentence or with a note, and leave nothing running.

Hostile files are built in tmp_path from a copy of a real fixture with sqlite3; ../shared is never written."""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import sys
import threading
import time
from pathlib import Path

import anyio
import psutil
import pytest
from conftest import FIXTURES, one_sentence, text_of
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from stallhound import synth
from stallhound.formats.nsys.raw import MAX_STRING_CHARS, RawExport
from stallhound.jobs import build as job_build
from stallhound.jobs.head import holds_trace_events
from stallhound.model.errors import LoadCancelled
from stallhound.model.limits import BUILD_MEMORY_MB
from stallhound.server.app import build_server

EXPORT = FIXTURES / "nsysai_h100_2gpu_1s.sqlite"  # 2.3 MB, 3,442 kernels
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
# A build's peak RSS runs a few hundred MB above its DuckDB limit (model/limits.py); a load of the untouched export
# peaks near 130 MB.
PEAK_RSS_MB = BUILD_MEMORY_MB + 500
CALL_LIMIT_S = 60
NESTED = 30_000  # the 60 KB JSON nested 30,000 deep: 2.3 GB when its header was parsed whole


def _copy(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copy(EXPORT, out)
    out.chmod(0o644)
    return out


def _raw_kernels(path: Path, table: str = KERNEL) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def recursive_view(tmp_path: Path, table: str = KERNEL) -> Path:
    """The export with `table` as a view over its rows joined to a recursive CTE that never ends."""
    out = _copy(tmp_path, "view.sqlite")
    with sqlite3.connect(out) as con:
        con.execute(f"ALTER TABLE {table} RENAME TO stored_rows")
        con.execute(f"""CREATE VIEW {table} AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)
                        SELECT stored_rows.* FROM stored_rows, r""")
    return out


def shared_long_name(tmp_path: Path, mb: int) -> tuple[Path, str]:
    """The export with one StringIds value of `mb` MB naming every kernel (short and demangled); and that value."""
    out = _copy(tmp_path, f"long_name_{mb}mb.sqlite")
    name = "k" * (mb << 20)
    with sqlite3.connect(out) as con:
        sid = con.execute(f"SELECT shortName FROM {KERNEL} GROUP BY 1 ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (name, sid))
        con.execute(f"UPDATE {KERNEL} SET shortName = ?, demangledName = ?", (sid, sid))
    return out, name


def _stdio(root: Path, cache: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "stallhound", "serve", "--root", str(root),
                                                               "--cache-dir", str(cache)], env=dict(os.environ))


def _server_process() -> psutil.Process:
    """The stdio server: this test process's only child running `stallhound serve`."""
    return next(p for p in psutil.Process().children(recursive=True) if "serve" in p.cmdline())


def _peak_rss_mb(process: psutil.Process) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024


async def _call(client: Client, tool: str, args: dict) -> tuple[str, bool, float]:
    start = time.perf_counter()
    with anyio.fail_after(CALL_LIMIT_S):  # a load that never ends fails the test instead of hanging it
        result = await client.call_tool(tool, args)
    return text_of(result), bool(result.is_error), time.perf_counter() - start


async def _row(client: Client, profile: str, sql: str) -> list:
    result = await client.call_tool("query_sql", {"profile": profile, "sql": sql})
    assert not result.is_error, text_of(result)
    return result.structured_content["rows"][0]


@pytest.mark.anyio
async def test_recursive_view_is_left_out_unread_and_named(tmp_path):
    export = recursive_view(tmp_path)
    async with Client(build_server([tmp_path], cache_dir=tmp_path / "cache")) as client:
        text, is_error, took = await _call(client, "load_profile", {"path": str(export)})
        counted = await _row(client, "view", "SELECT count(*) AS n FROM kernels")
    assert not is_error and took < 20, (took, text)
    assert f"the export's {KERNEL} is a view, not a table as nsys writes it, so it was left out unread" in text
    assert counted == [0]  # no kernel read, while the stored rows are there
    assert _raw_kernels(export, "stored_rows") == 3442


def test_a_view_of_the_strings_table_is_refused_in_one_sentence(tmp_path):
    export = recursive_view(tmp_path, "StringIds")
    start = time.perf_counter()
    with pytest.raises(Exception) as caught:
        RawExport(export)
    assert time.perf_counter() - start < 5
    one_sentence(str(caught.value))
    assert "has no readable StringIds table" in str(caught.value)


def test_a_column_computed_on_read_hides_its_table(tmp_path):
    out = _copy(tmp_path, "computed.sqlite")
    with sqlite3.connect(out) as con:
        con.execute(f"ALTER TABLE {KERNEL} ADD COLUMN bomb TEXT GENERATED ALWAYS AS (printf('%.*c', 100000000, 'x'))")
    raw = RawExport(out)
    try:
        assert not raw.has(KERNEL) and raw.has("CUPTI_ACTIVITY_KIND_RUNTIME")
        assert raw.notes == [f"the export's {KERNEL} is a table computed on read, not a table as nsys writes it, so "
                             "it was left out unread and that data reads as missing; re-export the report with "
                             "`nsys export --type sqlite` to get it back"]
    finally:
        raw.close()


def test_cancel_interrupts_an_sqlite_read_at_once(tmp_path):
    """The export's SQLite connection stops within milliseconds of a cancel, even inside a query that never ends."""
    export = recursive_view(tmp_path)
    cancelled = threading.Event()
    raw = RawExport(export, cancelled)
    failed: list[Exception] = []

    def read() -> None:
        try:
            raw.con.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()  # the view itself, read on purpose
        except sqlite3.OperationalError as exc:
            failed.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.5)
    cancelled.set()
    reader.join(2)
    assert not reader.is_alive(), "the read went on after the cancel"  # (closing it then would wait forever)
    raw.close()
    assert "interrupted" in str(failed[0]) and isinstance(raw.interrupted(), LoadCancelled)
    cpu = time.process_time()
    time.sleep(1)
    assert time.process_time() - cpu < 0.2  # nothing runs on after the cancel


@pytest.mark.anyio
async def test_cancel_load_of_a_hostile_export_leaves_no_work_running(tmp_path):
    export = recursive_view(tmp_path)
    server = build_server([tmp_path], cache_dir=tmp_path / "cache")
    async with Client(server) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "load_profile", {"path": str(export)})
            await anyio.sleep(0.3)
            await client.call_tool("cancel_load", {"paths": [str(export)]})
        await anyio.sleep(0.5)
        cpu = time.process_time()
        await anyio.sleep(2)
        assert time.process_time() - cpu < 0.3
        assert not [t.name for t in threading.enumerate() if t.name.startswith("stallhound build")]
        listed, _, _ = await _call(client, "list_profiles", {})  # the server still answers
    assert "no profiles loaded" in listed or "view" in listed


async def _load_long_name(tmp_path: Path, mb: int) -> None:
    export, name = shared_long_name(tmp_path, mb)
    async with Client(_stdio(tmp_path, tmp_path / "cache")) as client:
        text, is_error, took = await _call(client, "load_profile", {"path": str(export)})
        peak = _peak_rss_mb(_server_process())
        names = await _row(client, export.stem, (
            "SELECT count(*), min(length(name)), max(length(short_name)), "
            f"count(*) FILTER (WHERE name = short_name AND name = repeat('k', {MAX_STRING_CHARS})) FROM kernels"))
    assert not is_error, text
    assert peak < PEAK_RSS_MB, (peak, took)
    assert (f"1 string of the export's StringIds table ran past {MAX_STRING_CHARS:,} characters (the longest had "
            f"{len(name):,}); each was cut there") in text
    assert name.startswith("k" * MAX_STRING_CHARS)  # what the cut keeps is the value's head
    kernels = _raw_kernels(export)
    assert names == [kernels, MAX_STRING_CHARS, MAX_STRING_CHARS, kernels]


@pytest.mark.anyio
async def test_a_long_name_shared_by_every_kernel_is_cut_and_memory_holds(tmp_path):
    await _load_long_name(tmp_path, 8)


@pytest.mark.redteam
@pytest.mark.anyio
async def test_a_50mb_name_shared_by_every_kernel_is_cut_and_memory_holds(tmp_path):
    await _load_long_name(tmp_path, 50)


def _ranks(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for seed in range(count):
        synth.write_sample(folder / f"rank_{seed}.sqlite", synth.SynthConfig(seed=seed, devices=1, iterations=2,
                                                                             layers=1))


def _rss_watch(stop: threading.Event, seen: list[int]) -> None:
    me = psutil.Process()
    while not stop.is_set():
        seen.append(me.memory_info().rss)
        seen.append(-len(me.children(recursive=True)))
        time.sleep(0.02)


@pytest.mark.anyio
async def test_load_job_does_not_parse_a_hostile_json_lying_in_its_folder(tmp_path):
    run = tmp_path / "run"
    _ranks(run, 2)
    bomb = run / "notes.json"
    bomb.write_text('{"a":' + "[" * NESTED + "]" * NESTED + ', "traceEvents": []}')
    stop, seen = threading.Event(), []
    threading.Thread(target=_rss_watch, args=(stop, seen), daemon=True).start()
    before = psutil.Process().memory_info().rss
    async with Client(build_server([tmp_path], cache_dir=tmp_path / "cache")) as client:
        text, is_error, took = await _call(client, "load_job", {"paths": [str(run)], "workers": 1})
    stop.set()
    assert not is_error and "loaded a job of 2 ranks" in text and "notes.json" not in text, text
    assert (max(v for v in seen if v > 0) - before) / 2**20 < 200  # the header parse took 2.2 GB


def test_json_pick_reads_a_bounded_head(tmp_path):
    nested = tmp_path / "nested.json"
    nested.write_text('{"a":' + "[" * NESTED + "]" * NESTED + ', "traceEvents": []}')
    late = tmp_path / "late.json.gz"  # 600 MB of array before traceEvents, gzipped to under a MB
    with gzip.open(late, "wb", compresslevel=1) as fh:
        fh.write(b'{"a": [')
        fh.write(b"0," * (64 << 20))
        fh.write(b'0], "traceEvents": []}')
    inner = tmp_path / "inner.json"
    inner.write_text('{"x": {"traceEvents": []}, "y": "\\"traceEvents\\": []"}')
    plain = tmp_path / "plain.json"
    plain.write_text('{"schemaVersion": 1, "deviceProperties": [{"id": 0}], "traceEvents": [{"ph": "X"}]}')
    start = time.perf_counter()
    assert [holds_trace_events(p) for p in (nested, late, inner, plain)] == [False, False, False, True]
    assert time.perf_counter() - start < 3


def test_job_workers_are_capped_at_the_cores(tmp_path, monkeypatch):
    """workers=64 for 3 ranks on a machine of 2 cores: at most 2 build processes (and the pool's resource tracker)."""
    from stallhound.jobs.job import load_job
    monkeypatch.setattr(job_build, "cores", lambda: 2)
    monkeypatch.setattr("stallhound.jobs.job.cores", lambda: 2)
    _ranks(tmp_path / "run", 3)
    stop, seen = threading.Event(), []
    threading.Thread(target=_rss_watch, args=(stop, seen), daemon=True).start()
    job = load_job(tmp_path / "run", cache_dir=tmp_path / "cache", workers=64)
    stop.set()
    try:
        assert len(job.ranks) == 3
        assert 2 <= -min(seen) <= 3, -min(seen)
    finally:
        job.close()


def test_a_second_job_pool_waits_and_a_cancel_ends_the_wait():
    cancelled = threading.Event()
    assert job_build.POOLS.acquire(timeout=5)  # another job's load holds the one pool
    try:
        threading.Timer(0.5, cancelled.set).start()
        start = time.perf_counter()
        with pytest.raises(LoadCancelled, match="waited for another job's load"):
            job_build.Pool(2, cancelled)
        assert 0.4 < time.perf_counter() - start < 2
    finally:
        job_build.POOLS.release()
    pool = job_build.Pool(1, threading.Event())  # the slot is free again
    pool.close()


@pytest.mark.redteam
@pytest.mark.anyio
async def test_two_sessions_loading_jobs_at_once_run_one_pool(tmp_path):
    """Two clients load two different jobs at once with workers=64: one pool runs at a time, so the build processes
    never pass the cores (and the pool's resource tracker), and both jobs load."""
    for name in ("a", "b"):
        _ranks(tmp_path / name, 3)
    stop, seen = threading.Event(), []
    threading.Thread(target=_rss_watch, args=(stop, seen), daemon=True).start()
    server = build_server([tmp_path], cache_dir=tmp_path / "cache")
    texts: list[str] = []

    async def load(name: str) -> None:
        async with Client(server) as client:
            texts.append((await _call(client, "load_job", {"paths": [str(tmp_path / name)], "workers": 64}))[0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(load, "a")
        tg.start_soon(load, "b")
    stop.set()
    assert sum("loaded a job of 3 ranks" in t for t in texts) == 2, texts
    assert -min(seen) <= min(job_build.cores(), 3) + 1, -min(seen)
