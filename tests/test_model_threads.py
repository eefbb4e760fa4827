"""A model whose largest table fits in one DuckDB row group is read with one thread (model/duck.py says why); a
larger one with DuckDB's default, as a plain connection gets it. The setting is DuckDB's own, read back."""

from __future__ import annotations

import duckdb
from conftest import FIXTURES

from stallhound.formats import open_profile
from stallhound.model.duck import ROW_GROUP_ROWS, close_model, open_model

SETTING = "SELECT current_setting('threads')"


def _model(path, rows: int):
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE TABLE kernels AS SELECT range AS start_ns FROM range({rows})")
    return path


def test_model_threads_one_for_a_small_export(tmp_path):
    profile = open_profile(FIXTURES / "nsysai_h100_2gpu_1s.sqlite", cache_dir=tmp_path)
    try:
        rows = profile.con.execute("SELECT max(c) FROM (SELECT count(*) AS c FROM nvtx UNION ALL "
                                   "SELECT count(*) FROM cuda_api UNION ALL SELECT count(*) FROM kernels)").fetchone()
        assert 0 < rows[0] <= ROW_GROUP_ROWS
        assert profile.con.execute(SETTING).fetchone() == (1,)
    finally:
        profile.close()


def test_model_threads_edge_of_one_row_group(tmp_path):
    default = duckdb.connect().execute(SETTING).fetchone()[0]
    for rows, threads in ((ROW_GROUP_ROWS, 1), (ROW_GROUP_ROWS + 1, default)):
        path = _model(tmp_path / f"m{rows}.duckdb", rows)
        con = open_model(path)
        try:
            assert con.execute(SETTING).fetchone() == (threads,), rows
        finally:
            close_model(path, con)
