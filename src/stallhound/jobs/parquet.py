"""The hand-off format of a job: each rank's model as Parquet, a folder per table partitioned by rank
(`<table>/rank=<r>/<fingerprint>.parquet`), and the job connection: views over those files with `rank` first.

A rank that is one process of a file keeps that process's rows (and the devices it ran work on); one that is one
device keeps that device's rows. Rows tied to no process or device (pid or device_id NULL) and tables with
neither column (meta, capabilities) are in every rank of the file.
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from stallhound.jobs.ranks import GPU_WORK_SQL, RankSpec
from stallhound.model.duck import OFFLINE, one_row
from stallhound.model.schema import TABLE_NAMES

RANKS_DDL = "CREATE TABLE ranks (rank INTEGER, rank_source VARCHAR, source_path VARCHAR, profile_id VARCHAR)"
RANK = "rank"  # the partition column every view starts with; a model column of that name is left out


def _quoted(path: Path) -> str:
    """A path inside an SQL string literal (COPY, ATTACH and view definitions take no parameters)."""
    return str(path).replace("'", "''")


def _filter(con: duckdb.DuckDBPyConnection, table: str, spec: RankSpec) -> str:
    columns = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
    kind, value = spec.unit.kind, spec.unit.value
    if kind is None or value is None:  # the whole model is one rank (a unit of a kind always has its value)
        return "true"
    if kind == "process" and table == "gpus":
        return f"device_id IN (SELECT device_id FROM ({GPU_WORK_SQL}) WHERE pid = {int(value)})"
    column = {"process": "pid", "device": "device_id"}[kind]
    if column in columns:
        return f"({column} = {int(value)} OR {column} IS NULL)"
    return "true"


def _select(con: duckdb.DuckDBPyConnection, table: str) -> str:
    has_rank = one_row(con.execute("SELECT count(*) FROM duckdb_columns() WHERE table_name = ? AND column_name = ?",
                                   [table, RANK]))[0]
    return f"* EXCLUDE ({RANK})" if has_rank else "*"


def write_rank(spec: RankSpec, folder: Path, threads: int) -> float:
    """Write one rank's tables under `folder` from its cached model; the seconds it took."""
    start = time.perf_counter()
    con = duckdb.connect(config=OFFLINE)
    try:
        con.execute(f"SET threads = {int(threads)}")
        con.execute("SET enable_progress_bar = false")
        con.execute(f"ATTACH '{_quoted(spec.model_path)}' AS m (READ_ONLY)")
        con.execute("USE m")
        for table in TABLE_NAMES:
            out = folder / table / f"{RANK}={spec.rank}"
            out.mkdir(parents=True, exist_ok=True)
            con.execute(f"COPY (SELECT {_select(con, table)} FROM {table} WHERE {_filter(con, table, spec)}) "
                        f"TO '{_quoted(out / f'{spec.fingerprint}.parquet')}' (FORMAT parquet)")
    finally:
        con.close()
    return time.perf_counter() - start


def connect(folder: Path, specs: list[RankSpec]) -> duckdb.DuckDBPyConnection:
    """The job connection: a view per model table over its Parquet files (rank first) and the `ranks` table;
    SQL on it can read files under `folder` only."""
    con = duckdb.connect(config=OFFLINE)
    con.execute("SET enable_progress_bar = false")
    con.execute(RANKS_DDL)
    con.executemany("INSERT INTO ranks VALUES (?, ?, ?, ?)",
                    [(s.rank, s.rank_source, str(s.path), s.fingerprint) for s in specs])
    for table in TABLE_NAMES:
        files = _quoted(folder / table / "*" / "*.parquet")
        con.execute(f"CREATE VIEW {table} AS SELECT {RANK}, * EXCLUDE ({RANK}) FROM read_parquet('{files}', "
                    f"hive_partitioning = true, hive_types = {{'{RANK}': INTEGER}}, union_by_name = true)")
    con.execute("SET allowed_directories = ?", [[str(folder) + "/"]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con
