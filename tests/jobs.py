"""A job connection for tests: every model table of each rank's model as one view with a `rank` column.

Stands in for the job module's own builder (the same contract: each model table is a view whose first column
is `rank INTEGER`, plus a `ranks(rank, rank_source, source_path, profile_id)` table).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from nsightful.profiles.model import TABLE_NAMES


def job_connection(models: list[Path], rank_source: str = "order", hosts: list[str] | None = None
                   ) -> duckdb.DuckDBPyConnection:
    """Rank r is models[r] (a built model file), attached read-only; `hosts` replaces meta.host per rank (ranks
    captured on different machines)."""
    con = duckdb.connect(":memory:")
    for r, model in enumerate(models):
        con.execute(f"ATTACH '{model}' AS rank{r} (READ_ONLY)")
    for table in TABLE_NAMES:
        star = {r: f"* REPLACE ('{hosts[r]}' AS host)" if hosts and table == "meta" else "*"
                for r in range(len(models))}
        parts = " UNION ALL BY NAME ".join(f"SELECT {r}::INTEGER AS rank, {star[r]} FROM rank{r}.{table}"
                                           for r in range(len(models)))
        con.execute(f"CREATE VIEW {table} AS {parts}")
    con.execute("CREATE TABLE ranks (rank INTEGER, rank_source VARCHAR, source_path VARCHAR, profile_id VARCHAR)")
    con.executemany("INSERT INTO ranks VALUES (?, ?, ?, ?)",
                    [(r, rank_source, str(m), f"p{r}") for r, m in enumerate(models)])
    return con
