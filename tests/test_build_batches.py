"""A small export's build: its statements committed in a few transactions (BuildSteps.batch) give the very model
the statement-by-statement build gives, and its SQLite scanner is loaded without DuckDB's signature check while
every later LOAD is checked as ever."""

from __future__ import annotations

import shutil

import duckdb
import pytest
from conftest import FIXTURE_FILES, FIXTURE_IDS, FIXTURES

from stallhound.formats import open_profile
from stallhound.formats.build_steps import BuildSteps
from stallhound.formats.nsys import build as nsys_build
from stallhound.model import duck


def _model(path, cache) -> dict[str, list[tuple]]:
    profile = open_profile(path, cache_dir=cache)
    try:
        tables = [t for (t,) in profile.con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        return {t: profile.con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall() for t in tables}
    finally:
        profile.close()


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=FIXTURE_IDS)
def test_build_batches_give_the_model_of_the_unbatched_build(path, tmp_path, monkeypatch):
    assert path.stat().st_size <= nsys_build.BATCHED_MAX_BYTES  # the fixtures are small: built in batches
    batched = _model(path, tmp_path / "batched")
    monkeypatch.setattr(nsys_build, "BATCHED_MAX_BYTES", -1)
    assert _model(path, tmp_path / "unbatched") == batched


class _Steps(BuildSteps):
    steps = ()


@pytest.mark.parametrize("batched", [True, False])
def test_build_batches_commit_at_the_end_of_the_block_only_when_batched(tmp_path, batched):
    b = _Steps(tmp_path / "in.sqlite", tmp_path / "out.duckdb", None, "100MB")
    b.batched = batched
    other = b.con.cursor()
    try:
        with b.batch():
            b.sql("CREATE TABLE t AS SELECT 1 AS x")
            seen_inside = other.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 't'").fetchone()
        seen_after = other.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 't'").fetchone()
    finally:
        other.close()
        b.con.close()
    assert seen_inside == ((0,) if batched else (1,))  # another connection sees nothing before the commit
    assert seen_after == (1,)


def test_build_batches_a_failed_block_commits_nothing(tmp_path):
    out = tmp_path / "out.duckdb"
    b = _Steps(tmp_path / "in.sqlite", out, None, "100MB")
    b.batched = True
    with pytest.raises(duckdb.CatalogException), b.running(), b.batch():
        b.sql("CREATE TABLE t AS SELECT 1 AS x")
        b.sql("SELECT * FROM missing")
    with duckdb.connect(str(out)) as con:
        assert con.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)


def test_build_batches_scanner_loaded_then_unsigned_extensions_refused(tmp_path, monkeypatch):
    tampered = tmp_path / "tampered.duckdb_extension"
    shutil.copyfile(duck._scanner_path(), tampered)
    with tampered.open("r+b") as f:  # one byte changed: its signature no longer matches
        f.seek(tampered.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    seen = []

    def load_then_try(con):
        duck.load_sqlite_scanner(con)
        seen.append(con.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()[0])
        with pytest.raises(duckdb.IOException, match="signature"):
            con.execute(f"LOAD '{tampered}'")
        with pytest.raises(duckdb.InvalidInputException):
            con.execute("SET allow_unsigned_extensions = true")

    monkeypatch.setattr(nsys_build, "load_sqlite_scanner", load_then_try)
    _model(FIXTURES / "nsysai_mock.sqlite", tmp_path / "cache")
    assert seen == [False]
