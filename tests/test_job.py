"""Jobs: every rank of a run from several profiles (or one of several processes), built in parallel or on Dask,
handed off as Parquet partitioned by rank; checked against the raw files read independently."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest
from modeldb import make_model

from stallhound import synth
from stallhound.jobs import build as job_build
from stallhound.jobs.dask import DaskUnavailable, connect
from stallhound.jobs.files import rank_in_name
from stallhound.jobs.job import STALE_WRITE_S, load_job
from stallhound.jobs.ranks import RanksInvalid, assign, probe
from stallhound.model.errors import LoadCancelled
from stallhound.model.schema import TABLE_NAMES

KINETO = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kineto"
KINETO_RANKS = [KINETO / "hta_sampled_rank0.json.gz", KINETO / "hta_sampled_rank1.json.gz"]
SMALL = {"iterations": 4, "layers": 2}  # a few hundred kernels per rank: quick to build, enough to compare


def trace_kernels(path: Path) -> int:
    with gzip.open(path, "rt") as fh:
        return sum(1 for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel")


def export_kernels_per_pid(path: Path) -> dict[int, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT (globalPid >> 24) & 16777215, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                           "GROUP BY 1").fetchall()
    return dict(rows)


def write_ranks(folder: Path, names: list[str], devices: int = 1) -> list[Path]:
    """One synthetic export per name, each of its own content (seed)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / name for name in names]
    for seed, path in enumerate(paths):
        synth.write_sample(path, synth.SynthConfig(seed=seed, devices=devices, **SMALL))
    return paths


def rows_of(job) -> dict[str, list[tuple]]:
    return {t: sorted(job.con.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in (*TABLE_NAMES, "ranks")}


@pytest.fixture(scope="module")
def kineto_job(tmp_path_factory):
    job = load_job(KINETO_RANKS, cache_dir=tmp_path_factory.mktemp("job-cache"), workers=2)
    yield job
    job.close()


def test_load_job_kineto_ranks_from_distributed_info(kineto_job):
    ranks = kineto_job.con.execute("SELECT rank, rank_source, source_path FROM ranks ORDER BY rank").fetchall()
    assert ranks == [(0, "distributedInfo", str(KINETO_RANKS[0])), (1, "distributedInfo", str(KINETO_RANKS[1]))]
    per_rank = dict(kineto_job.con.execute("SELECT rank, count(*) FROM kernels GROUP BY rank").fetchall())
    assert per_rank == {0: trace_kernels(KINETO_RANKS[0]), 1: trace_kernels(KINETO_RANKS[1])}


def test_load_job_views_start_with_rank_and_read_only_the_job(kineto_job):
    for table in TABLE_NAMES:
        first = kineto_job.con.execute(f"DESCRIBE {table}").fetchone()
        assert first[:2] == ("rank", "INTEGER")
    with pytest.raises(Exception, match="(?i)permission|disabled"):
        kineto_job.con.execute("SELECT * FROM read_csv('/etc/passwd')").fetchall()


def test_load_job_parquet_in_cache_partitioned_by_rank(tmp_path):
    folder = tmp_path / "run"
    write_ranks(folder, ["rank_0.sqlite", "rank_1.sqlite"])
    before = sorted(folder.iterdir())
    job = load_job(folder, cache_dir=tmp_path / "cache", workers=1)
    try:
        assert job.folder.is_relative_to(tmp_path / "cache")
        assert sorted(p.name for p in (job.folder / "kernels").iterdir()) == ["rank=0", "rank=1"]
        assert len(list(job.folder.glob("*/rank=*/*.parquet"))) == 2 * len(TABLE_NAMES)
        assert sorted(folder.iterdir()) == before  # nothing written beside the profiles
        assert job.timings.write_s > 0 and not job.timings.reused
    finally:
        job.close()
    again = load_job(folder, cache_dir=tmp_path / "cache", workers=1)
    assert again.timings.reused and again.folder == job.folder
    again.close()


def test_load_job_removes_a_killed_loads_temporary_folder(tmp_path):
    paths = write_ranks(tmp_path / "run", ["rank_0.sqlite"])
    job = load_job(paths, cache_dir=tmp_path / "cache", workers=1)
    job.close()
    shutil.rmtree(job.folder)
    killed, recent = (job.folder.with_name(f".{job.folder.name}-{n}") for n in ("killed", "running"))
    for folder in (killed, recent):
        (folder / "kernels").mkdir(parents=True)
    old = time.time() - STALE_WRITE_S - 60
    os.utime(killed, (old, old))
    load_job(paths, cache_dir=tmp_path / "cache", workers=1).close()
    assert not killed.exists() and recent.exists() and job.folder.is_dir()


def test_load_job_parallel_build_matches_serial(tmp_path):
    paths = write_ranks(tmp_path / "run", ["r_r0.sqlite", "r_r1.sqlite", "r_r2.sqlite"])
    serial = load_job(paths, cache_dir=tmp_path / "serial", workers=1)
    parallel = load_job(paths, cache_dir=tmp_path / "parallel", workers=3)
    try:
        assert [(s.rank, s.rank_source) for s in serial.ranks] == [(0, "file name"), (1, "file name"),
                                                                   (2, "file name")]
        assert rows_of(parallel) == rows_of(serial)
        per_rank = dict(serial.con.execute("SELECT rank, count(*) FROM kernels GROUP BY rank").fetchall())
        assert per_rank == {i: sum(export_kernels_per_pid(p).values()) for i, p in enumerate(paths)}
    finally:
        serial.close()
        parallel.close()


def test_load_job_one_export_of_several_processes_is_a_rank_each(tmp_path):
    (path,) = write_ranks(tmp_path, ["train.sqlite"], devices=4)
    job = load_job([path], cache_dir=tmp_path / "cache", workers=1)
    try:
        ranks = job.con.execute("SELECT rank, rank_source FROM ranks ORDER BY rank").fetchall()
        assert ranks == [(r, "process") for r in range(4)]
        got = job.con.execute("SELECT rank, min(pid), max(pid), count(*) FROM kernels GROUP BY rank "
                              "ORDER BY rank").fetchall()
        raw = sorted(export_kernels_per_pid(path).items())
        assert [(r, pid, pid, n) for r, (pid, n) in enumerate(raw)] == got
        devices = job.con.execute("SELECT rank, count(*) FROM gpus GROUP BY rank ORDER BY rank").fetchall()
        assert devices == [(r, 1) for r in range(4)]
    finally:
        job.close()


def test_load_job_order_given_when_nothing_names_the_rank(tmp_path):
    paths = write_ranks(tmp_path / "run", ["beta.sqlite", "alpha.sqlite"])
    job = load_job(paths, cache_dir=tmp_path / "cache", workers=1)
    try:
        assert job.con.execute("SELECT rank, rank_source, source_path FROM ranks ORDER BY rank").fetchall() == [
            (0, "order", str(paths[0])), (1, "order", str(paths[1]))]
    finally:
        job.close()


def test_load_job_file_name_patterns():
    assert [rank_in_name(Path(n)) for n in ("run_rank_3.sqlite", "x_r12.json.gz", "trace.5.json", "rank7.sqlite",
                                            "plain.sqlite")] == [3, 12, 5, 7, None]


def test_load_job_duplicate_rank_is_one_error_naming_it(tmp_path):
    copy = tmp_path / "again.json.gz"
    shutil.copy(KINETO_RANKS[0], copy)
    with pytest.raises(RanksInvalid, match=r"rank 0 by hta_sampled_rank0.json.gz \(distributedInfo\), "
                                           r"again.json.gz \(distributedInfo\)"):
        load_job([KINETO_RANKS[0], copy], cache_dir=tmp_path / "cache", workers=1)


def test_load_job_missing_ranks_are_one_error_naming_them(tmp_path):
    paths = write_ranks(tmp_path / "run", ["rank_0.sqlite", "rank_3.sqlite"])
    with pytest.raises(RanksInvalid, match=r"ranks 1, 2 are missing from the job \(found 0 \(file name\), "
                                           r"3 \(file name\)\)"):
        load_job(paths, cache_dir=tmp_path / "cache", workers=1)


def test_load_job_dask_local_cluster_matches_serial(tmp_path):
    distributed = pytest.importorskip("distributed")
    paths = write_ranks(tmp_path / "run", ["rank_0.sqlite", "rank_1.sqlite"])
    serial = load_job(paths, cache_dir=tmp_path / "serial", workers=1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        client = connect(cluster.scheduler_address, None)
        try:
            on_dask = load_job(paths, cache_dir=tmp_path / "dask", dask_client=client)
        finally:
            client.close()
    try:
        assert rows_of(on_dask) == rows_of(serial)
        assert len(list(on_dask.folder.glob("kernels/rank=*/*.parquet"))) == 2
    finally:
        serial.close()
        on_dask.close()


def test_load_job_dask_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(DaskUnavailable, match=r"pip install 'stallhound\[distributed\]'"):
        connect("tcp://127.0.0.1:8786", None)


def _probe(con, name: str):
    return probe(con, Path(f"/runs/{name}"), name, Path(f"/cache/{name}.duckdb"), 0.0)


def _kernel(pid: int, device: int, start: int) -> dict:
    return {"pid": pid, "device_id": device, "start_ns": start, "end_ns": start + 10, "category": "compute"}


def test_load_job_ranks_from_meta_rank_before_the_file_name():
    models = []
    for rank in (1, 0):
        con = make_model(kernels=[_kernel(7, 0, 100)])
        con.execute("UPDATE meta SET rank = ?", [rank])
        models.append(con)
    specs = assign([_probe(models[0], "rank_0.sqlite"), _probe(models[1], "rank_1.sqlite")])
    assert [(s.rank, s.rank_source, s.path.name) for s in specs] == [(0, "distributedInfo", "rank_1.sqlite"),
                                                                     (1, "distributedInfo", "rank_0.sqlite")]


def test_load_job_processes_ranked_by_nccl_metadata_when_each_has_one():
    con = make_model(kernels=[_kernel(10, 0, 100), _kernel(20, 1, 100), _kernel(20, 1, 300)])
    con.execute("UPDATE kernels SET nccl_group = '0', nccl_rank = CASE pid WHEN 10 THEN 1 ELSE 0 END")
    specs = assign([_probe(con, "node0.sqlite")])
    assert [(s.rank, s.rank_source, s.unit.kind, s.unit.value) for s in specs] == [(0, "nccl", "process", 20),
                                                                                   (1, "nccl", "process", 10)]


def test_load_job_nccl_rank_counts_only_in_the_world_group():
    con = make_model(kernels=[_kernel(10, 0, 100), _kernel(10, 0, 300)])
    con.execute("UPDATE kernels SET nccl_rank = 0, nccl_group = '3'")  # a subgroup's rank 0
    assert _probe(con, "x.json").nccl_rank is None
    con.execute("UPDATE kernels SET nccl_rank = 5, nccl_group = '0' WHERE start_ns = 300")
    assert _probe(con, "x.json").nccl_rank == 5


def test_load_job_one_process_on_several_devices_is_a_rank_per_device():
    con = make_model(kernels=[_kernel(10, 3, 100), _kernel(10, 1, 100)])
    later = make_model(kernels=[_kernel(11, 0, 100)])
    specs = assign([_probe(con, "node0.sqlite"), _probe(later, "node1.sqlite")])
    assert [(s.rank, s.rank_source, s.unit.value) for s in specs] == [(0, "device", 1), (1, "device", 3),
                                                                      (2, "order", None)]


def test_load_job_cancelled_stops_before_writing(tmp_path):
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(LoadCancelled, match="loading the job was cancelled"):
        load_job(KINETO_RANKS, cache_dir=tmp_path, workers=1, cancelled=cancelled)
    assert not (tmp_path / "jobs").exists() and not list(tmp_path.glob("*.duckdb"))


def test_load_job_reopen_from_the_cache_starts_no_pool(tmp_path, monkeypatch):
    load_job(KINETO_RANKS, cache_dir=tmp_path, workers=1).close()
    monkeypatch.setattr(job_build, "Pool", lambda *args: pytest.fail("a process pool was started"))
    again = load_job(KINETO_RANKS, cache_dir=tmp_path, workers=2)
    try:
        assert again.timings.reused and len(again.ranks) == 2
    finally:
        again.close()
