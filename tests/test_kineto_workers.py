"""Issue 33: a large Kineto trace's batches are parsed in worker processes (formats.kineto.workers). The model they
build equals, table by table and row by row, the one the in-process parse builds (real traces cut into many batches,
so most events go through the workers); a pool that breaks leaves its batches to this process, with the same rows;
small traces, one-core machines and processes that are themselves workers start none."""

from __future__ import annotations

import gzip
import json
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import duckdb
import pytest

from stallhound.formats.kineto import batches, workers
from stallhound.formats.kineto.build import build

KINETO = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kineto"
NCCL = KINETO / "hta_a100_nccl_rank0.json.gz"  # 8.6 MB of events: NCCL kernels and comms ops, names, every kind
BATCH_BYTES = 256 << 10  # ~35 batches of the NCCL fixture


def _model(path: Path, out: Path, monkeypatch, forced: bool) -> Path:
    """Build the model of `path` into `out`, its batches parsed by workers (`forced`) or in this process."""
    monkeypatch.setattr(batches, "BATCH_BYTES", BATCH_BYTES)
    monkeypatch.setattr(workers, "WORKERS_FROM_BYTES", 0 if forced else 1 << 62)
    build(path, out, "fingerprint")
    monkeypatch.undo()
    return out


def _differences(a: Path, b: Path) -> dict[str, tuple[int, int, int]]:
    """Per model table (meta without its path): rows, rows of a not in b, rows of b not in a (as multisets)."""
    con = duckdb.connect()
    con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
    tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'a'").fetchall()]
    out = {}
    for table in tables:
        rows = "SELECT * EXCLUDE (source_path) FROM {}.meta" if table == "meta" else f"SELECT * FROM {{}}.{table}"
        counts = [con.execute(f"SELECT count(*) FROM ({q})").fetchone()[0] for q in (  # type: ignore[index]
            rows.format("a"), f"{rows.format('a')} EXCEPT ALL {rows.format('b')}",
            f"{rows.format('b')} EXCEPT ALL {rows.format('a')}")]
        out[table] = (counts[0], counts[1], counts[2])
    return out


def test_workers_build_the_model_the_in_process_parse_builds(tmp_path, monkeypatch):
    taken: list[int] = []
    parse_all = workers.Pool.parse_all

    def counted(self, bodies):
        return parse_all(self, (taken.append(len(body)) or body for body in bodies))
    monkeypatch.setattr(workers.Pool, "parse_all", counted)
    forced = _model(NCCL, tmp_path / "workers.duckdb", monkeypatch, forced=True)
    assert len(taken) > 20 and sum(taken) > 8 << 20  # most of the events went through the workers
    alone = _model(NCCL, tmp_path / "alone.duckdb", monkeypatch, forced=False)
    differences = _differences(alone, forced)
    assert differences["kernels"][0] == 2700 and differences["nvtx"][0] == 14388 and differences["cuda_api"][0] == 8740
    assert {t: d for t, d in differences.items() if d[1] or d[2]} == {}
    # the names the workers sent back name the threads (Kineto's process_name / thread_name events)
    con = duckdb.connect(str(forced), read_only=True)
    assert con.execute("SELECT count(*) FROM threads").fetchone()[0] == 2  # type: ignore[index]
    # NCCL kernels take their size from the comms ops a worker staged (kineto.nccl)
    assert con.execute("SELECT count(nccl_message_bytes) FROM kernels WHERE category = 'nccl'").fetchone() == (21,)


def test_a_broken_pool_leaves_its_batches_to_this_process(tmp_path, monkeypatch):
    def broken(self, fn, *args):
        raise BrokenProcessPool("a worker was killed")
    monkeypatch.setattr(workers.ProcessPoolExecutor, "submit", broken)
    forced = _model(NCCL, tmp_path / "broken.duckdb", monkeypatch, forced=True)
    alone = _model(NCCL, tmp_path / "alone.duckdb", monkeypatch, forced=False)
    assert {t: d for t, d in _differences(alone, forced).items() if d[1] or d[2]} == {}


def test_workers_start_only_where_they_pay(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "WORKERS_FROM_BYTES", 16 << 20)  # the files stay small
    big = tmp_path / "big.json"
    big.write_bytes(b" " * workers.WORKERS_FROM_BYTES)
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 16)
    assert workers.workers_for(big) == workers.MAX_WORKERS
    assert workers.workers_for(NCCL) == 0  # 0.75 MB gzipped, about 8.6 MB of JSON: under 16 MB
    packed = tmp_path / "packed.json.gz"
    packed.write_bytes(gzip.compress(b" " * 64) + b" " * (workers.WORKERS_FROM_BYTES // workers.GZIP_LOW_RATIO))
    assert workers.workers_for(packed) == workers.MAX_WORKERS  # its JSON is over WORKERS_FROM_BYTES
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 1)
    assert workers.workers_for(big) == 0
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 2)
    assert workers.workers_for(big) == 2
    monkeypatch.setattr(workers.multiprocessing, "parent_process", lambda: object())  # a job's build process
    assert workers.workers_for(big) == 0


@pytest.mark.parametrize("body", [b'[{"ph": "X", "cat": "kernel", "ts": 1700000000123456.789, "dur": 1.5, '
                                  b'"name": "k", "args": {"correlation": 7}}, 5, {"ph": "M", "name": "thread_name", '
                                  b'"pid": 1, "tid": 2, "args": {"name": "thread 2 (main)"}}]'])
def test_a_worker_sends_back_columns_names_and_counts(body):
    parsed = workers.parse(body)
    assert parsed.read == 2 and parsed.dropped == 1  # the 5 is no event
    assert parsed.names == [("thread_name", 1, 2, "thread 2 (main)")]
    gpu = parsed.columns["gpu"]
    assert gpu is not None and gpu[5] == "[1700000000123456789]" and gpu[6] == "[1700000000123458289]"
    assert parsed.columns["host"] is None


def test_names_given_in_the_batches_name_the_threads(tmp_path, monkeypatch):
    """Kineto writes its process and thread names last, but other writers put them first: in a worker's batch."""
    names = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
             {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "thread 2 (main)"}}]
    ops = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 2, "ts": 1000 + 10 * i, "dur": 5,
            "args": {"External id": i}} for i in range(20_000)]
    path = tmp_path / "names_first.json"
    path.write_text('{"traceEvents": [\n' + ",\n".join(json.dumps(e) for e in [*names, *ops]) + "\n]}")
    forced = _model(path, tmp_path / "workers.duckdb", monkeypatch, forced=True)
    alone = _model(path, tmp_path / "alone.duckdb", monkeypatch, forced=False)
    assert {t: d for t, d in _differences(alone, forced).items() if d[1] or d[2]} == {}
    con = duckdb.connect(str(forced), read_only=True)
    assert con.execute("SELECT pid, tid, name FROM threads").fetchall() == [(1, 2, "main")]
    assert con.execute("SELECT count(*) FROM nvtx").fetchone() == (20_000,)
