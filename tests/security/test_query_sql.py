"""Issue 30, items 1-5: query_sql runs only plain queries over the model, within bounds, and cannot crash, starve
or spy on the server. Unit tests on the allow-list with tiny queries; attacks over a real MCP client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import duckdb
import pytest
from conftest import FIXTURES, text_of
from mcp.client import Client

from stallhound.model import sql_allow
from stallhound.model.errors import QueryRefused
from stallhound.server.app import build_server

MOCK = str(FIXTURES / "nsysai_mock.sqlite")
BIG = str(FIXTURES / "nsysai_h100_2gpu_1s.sqlite")  # 3,442 kernels: a triple self-join runs for minutes
TABLES = {"kernels", "memcpy"}
PROMPT_S = 2.0  # another client's describe_schema answers within this while a heavy query runs (alone: ~0.05 s)
PARSE_S = 0.5  # the slowest text the bounds let through parses within this (30,000 nested comments took 29 s)
SMALL_MEMORY_MB = 100  # STALLHOUND_MODEL_MEMORY_MB for the memory tests: fails fast, far above the fixture's needs
RSS_SLACK_MB = 400  # peak RSS above the limit allowed for the last chunks in flight when the query is stopped

ACCEPTED = [
    "SELECT count(*) AS n FROM kernels",
    "WITH a AS (SELECT * FROM kernels) SELECT a.start_ns FROM a JOIN memcpy m USING (start_ns)",
    "SELECT short_name, count(*) FROM kernels GROUP BY ALL ORDER BY 2 DESC NULLS LAST LIMIT 5 OFFSET 2",
    "SELECT x FROM range(10) t(x) UNION ALL SELECT 1 EXCEPT SELECT 2",
    "SELECT * FROM generate_series(1, 1000000)", "SELECT * FROM range(-3, 4)", "SELECT unnest([1, 2])",
    "SELECT sum(x) OVER (ORDER BY x ROWS 1 PRECEDING) FROM range(5) t(x) QUALIFY row_number() OVER () < 3",
    "SELECT CASE WHEN 1 BETWEEN 0 AND 2 THEN 'a' END, 1 IN (1, 2), EXISTS (SELECT 1), 'a' ILIKE 'A'",
    "SELECT k.start_ns, m.* FROM kernels k LEFT JOIN LATERAL (SELECT * FROM memcpy LIMIT 1) m ON true",
    "SELECT list_transform([1, 2], x -> x + 1), COLUMNS('start.*') FROM kernels", "DESCRIBE kernels",
    "SELECT repeat('x', 30000), printf('%5d', 3), string_agg(short_name, ',') FROM kernels",
    "SELECT 1 /* a /* nested */ comment */ -- and a line\n",
]

REFUSED = [  # (query, words the one-sentence refusal holds)
    ("SELECT * FROM enable_logging(['QueryLog'])", "table function enable_logging()"),
    ("SELECT * FROM enable_logging(storage='file', storage_path='/tmp/x')", "table function enable_logging()"),
    ("SELECT message FROM duckdb_logs", "'duckdb_logs' is not one of them"),
    ("SELECT * FROM duckdb_settings()", "table function duckdb_settings()"),
    ("SELECT * FROM duckdb_databases()", "table function duckdb_databases()"),
    ("SELECT * FROM read_csv('/etc/passwd')", "table function read_csv()"),
    ("SELECT * FROM '/etc/passwd'", "'/etc/passwd' is not one of them"),
    ("SELECT * FROM glob('/*')", "table function glob()"),
    ("SELECT getenv('HOME')", "function getenv()"),
    ("SELECT main.getenv('HOME')", "function getenv()"),
    ("SELECT current_setting('memory_limit')", "function current_setting()"),
    ("SELECT * FROM pragma_version()", "table function pragma_version()"),
    ("SELECT * FROM query('SELECT 1')", "table function query()"),
    ("SELECT * FROM query_table('kernels')", "table function query_table()"),
    ("SELECT * FROM sql_auto_complete('SEL')", "table function sql_auto_complete()"),
    ("SELECT json_serialize_plan('SELECT 1')", "function json_serialize_plan()"),
    ("SELECT write_log('x')", "function write_log()"),
    ("SELECT * FROM (SELECT * FROM read_text('/etc/passwd'))", "table function read_text()"),
    ("WITH a AS (SELECT * FROM glob('*')) SELECT * FROM a", "table function glob()"),
    ("SELECT * FROM kernels, LATERAL (SELECT * FROM read_blob('x'))", "table function read_blob()"),
    ("SELECT (SELECT count(*) FROM duckdb_settings())", "table function duckdb_settings()"),
    ("SELECT * FROM information_schema.tables", "'information_schema.tables' is not one of them"),
    ("SELECT * FROM kernels AT (VERSION => 1)", "'kernels' is not one of them"),
    ("CREATE MACRO m(a) AS a", "not CREATE"), ("COPY kernels TO '/tmp/x.csv'", "not COPY"),
    ("ATTACH '/tmp/x.db'", "not ATTACH"), ("INSTALL httpfs", "not LOAD"), ("LOAD httpfs", "not LOAD"),
    ("SET threads = 1", "not SET"), ("CALL pragma_version()", "not CALL"),
    ("EXPORT DATABASE '/tmp/x'", "not EXPORT"), ("SELECT 1; SELECT 2", "exactly one statement (got 2)"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/x.wal'", "not EXPLAIN"), ("EXPLAIN SELECT 1", "not EXPLAIN"),
    ("WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT * FROM t", "recursive cte"),
    ("SELECT $1", "parameter expressions"), ("SUMMARIZE kernels", "SUMMARY"),
    ("SELECT count(*) FROM (SELECT unnest(range(60000000)))", "range(60000000) makes 60,000,000 rows"),
    ("SELECT * FROM generate_series(1, 1000001)", "makes 1,000,001 rows"),
    ("SELECT range(0, 10, 0)", "a step of 0"),
    ("SELECT repeat('x', 1000000) FROM range(1000)", "repeat() may make values of at most 100,000"),
    ("SELECT repeat(short_name, 1000) FROM kernels", "repeat() may make values of at most 100 "),
    ("SELECT lpad('x', 100000000, 'y')", "lpad()"), ("SELECT printf('%1000000d', 1)", "printf()"),
]


@pytest.mark.parametrize("sql", ACCEPTED)
def test_query_sql_allows_plain_queries_over_the_model(sql):
    sql_allow.check(sql, TABLES)


@pytest.mark.parametrize(("sql", "words"), REFUSED)
def test_query_sql_refuses_everything_else_in_one_sentence(sql, words):
    with pytest.raises(QueryRefused) as refused:
        sql_allow.check(sql, TABLES)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_query_sql_refuses_every_table_function_pragma_and_unvetted_function_duckdb_has():
    """Generated from DuckDB's own catalog: a function added by a DuckDB upgrade is refused until it is vetted."""
    catalog = duckdb.connect().execute("SELECT DISTINCT function_type, function_name FROM duckdb_functions()")
    listed = catalog.fetchall()
    tables = [n for t, n in listed if t in ("table", "table_macro") and n not in sql_allow.TABLE_FUNCTIONS]
    scalars = [n for t, n in listed if t in ("scalar", "aggregate", "macro") and n not in sql_allow.FUNCTIONS
               and n.isidentifier()]
    pragmas = [n for t, n in listed if t == "pragma"]
    assert {"enable_logging", "duckdb_logs", "read_csv", "glob", "query", "checkpoint"} <= set(tables)
    assert {"current_setting", "write_log", "setseed", "nextval", "sleep_ms"} <= set(scalars)
    for sql in ([f'SELECT * FROM "{n}"()' for n in tables] + [f'SELECT "{n}"(1)' for n in scalars]
                + [f"PRAGMA {n}" for n in pragmas] + [f"SELECT * FROM pragma_{n}()" for n in pragmas]):
        with pytest.raises(QueryRefused):
            sql_allow.check(sql, TABLES)


@pytest.mark.parametrize("sql", ["SET memory_limit = '1TB'", "RESET memory_limit", "SET GLOBAL threads = 64",
                                 "PRAGMA enable_logging", "PRAGMA disable_optimizer", "SET VARIABLE v = 1",
                                 "SELECT * FROM disable_logging()", "SELECT * FROM truncate_duckdb_logs()",
                                 "SELECT * FROM duckdb_log_contexts()", "SET lock_configuration = false",
                                 "SET enable_external_access = true", "SET allowed_paths = ['/']", "USE system",
                                 "SELECT set_bit('1'::BIT, 0, 1) FROM duckdb_settings()", "CHECKPOINT", "VACUUM"])
def test_query_sql_refuses_every_setter_and_logging_switch(sql):
    with pytest.raises(QueryRefused):
        sql_allow.check(sql, TABLES)


@pytest.mark.parametrize("text", [
    "SELECT 1 " + "/*" * 30_000 + "*/" * 30_000,  # the 120 KB attack
    "SELECT " + "(" * 65 + "1" + ")" * 65,
    "SELECT ')))))' || " + "(" * 65 + "1" + ")" * 65,  # closers in a string do not buy depth
    "SELECT 1" + " " * sql_allow.MAX_SQL_CHARS])
def test_query_sql_bounds_the_text_before_parsing(text):
    started = time.perf_counter()
    with pytest.raises(QueryRefused) as refused:
        sql_allow.check(text, TABLES)
    assert time.perf_counter() - started < 0.1 and "query_sql's" in str(refused.value)


def test_query_sql_parses_the_worst_text_the_bounds_let_through_quickly():
    deepest = "/*" * sql_allow.MAX_NESTING + "*/" * sql_allow.MAX_NESTING + " "
    comments = "SELECT 1 " + deepest * ((sql_allow.MAX_SQL_CHARS - 9) // len(deepest))
    nested = "(" * sql_allow.MAX_NESTING + "1" + ")" * sql_allow.MAX_NESTING + " + "
    brackets = "SELECT " + nested * ((sql_allow.MAX_SQL_CHARS - 8) // len(nested)) + "1"
    for text in (comments, brackets):
        assert len(text) <= sql_allow.MAX_SQL_CHARS
        started = time.perf_counter()
        try:
            sql_allow.check(text, TABLES)
        except QueryRefused as refused:
            assert "\n" not in str(refused)
        assert time.perf_counter() - started < PARSE_S


# --- over a real MCP client ------------------------------------------------------------------------------------------
ATTACKS = [  # one call each: refused in one sentence, the server answers the next call
    "SELECT * FROM enable_logging(['QueryLog'])", "SELECT message FROM duckdb_logs",
    "SELECT count(*) FROM (SELECT unnest(range(60000000)))", "SELECT repeat('x', 1000000) FROM range(1000)",
    "SELECT 1 " + "/*" * 30_000 + "*/" * 30_000, "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
    "EXPLAIN ANALYZE SET VARIABLE v = 1", "EXPLAIN ANALYZE CHECKPOINT", "EXPLAIN ANALYZE VACUUM",
    "EXPLAIN ANALYZE CALL pragma_version()", "SELECT name, value FROM duckdb_settings()",
    "SELECT database_name, path FROM duckdb_databases()"]


@pytest.fixture
def cache(tmp_path) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir()
    return folder


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("*") if p.is_file()}


@pytest.mark.anyio
async def test_query_sql_attacks_over_mcp_are_refused_and_write_nothing(cache, tmp_path):
    async with Client(build_server([FIXTURES], cache_dir=cache)) as client:
        await client.call_tool("load_profile", {"path": MOCK})
        built = _files(cache)
        model = next(cache.rglob("*.duckdb"))
        writes = [f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{model}.wal'", f"COPY kernels TO '{tmp_path / 'out.csv'}'",
                  f"SELECT * FROM enable_logging(storage='file', storage_path='{tmp_path / 'logs'}')"]
        for sql in ATTACKS + writes:
            started = time.monotonic()
            result = await client.call_tool("query_sql", {"profile": MOCK, "sql": sql, "timeout_s": 1})
            text = text_of(result)
            assert result.is_error and "\n" not in text and len(text) < 400, (sql[:80], text)
            assert time.monotonic() - started < PROMPT_S, sql[:80]
        still = await client.call_tool("query_sql", {"profile": MOCK, "sql": "SELECT count(*) AS n FROM kernels"})
        assert still.structured_content["rows"] == [[2]]
    assert _files(cache) <= built and sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


ABORT = """
import anyio, sys
from pathlib import Path
from mcp.client import Client
from stallhound.server.app import build_server
async def main():
    async with Client(build_server([Path(sys.argv[1])], cache_dir=Path(sys.argv[2]))) as client:
        for sql in sys.argv[4:]:
            result = await client.call_tool("query_sql", {"profile": sys.argv[3], "sql": sql})
            print(result.content[0].text)
anyio.run(main)
"""


def test_query_sql_logging_to_a_file_no_longer_aborts_the_process(tmp_path):
    """Before: an INTERNAL error, then SIGABRT for every session. In a child process, so a regression kills only it."""
    attacks = [f"SELECT * FROM enable_logging(storage='file', storage_path='{tmp_path / 'x'}')",
               "SELECT * FROM enable_logging(['QueryLog'])", "SELECT message FROM duckdb_logs",
               "SELECT count(*) AS n FROM kernels"]
    done = subprocess.run([sys.executable, "-c", ABORT, str(FIXTURES), str(tmp_path / "cache"), MOCK, *attacks],
                          capture_output=True, text=True, timeout=60, env={**os.environ})
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "table function enable_logging()" in lines[0] and "table function enable_logging()" in lines[1]
    assert "'duckdb_logs' is not one of them" in lines[2] and lines[3:] == ["n", "2"]
    assert not (tmp_path / "x").exists()


async def _heavy_while_another_client_asks(server, sql: str, timeout_s: float) -> tuple[str, float, float]:
    """(the heavy call's answer, its seconds, the slowest of another client's describe_schema calls meanwhile)."""
    slowest, answer = 0.0, {}
    async with Client(server) as heavy, Client(server) as other:
        await heavy.call_tool("load_profile", {"path": BIG})

        async def attack() -> None:
            started = time.monotonic()
            result = await heavy.call_tool("query_sql", {"profile": BIG, "sql": sql, "timeout_s": timeout_s})
            answer.update(text=text_of(result), s=time.monotonic() - started)

        async with anyio.create_task_group() as tg:
            tg.start_soon(attack)
            while not answer:
                started = time.monotonic()
                asked = await other.call_tool("describe_schema", {"profile": BIG})
                assert not asked.is_error
                slowest = max(slowest, time.monotonic() - started)
                await anyio.sleep(0.1)
    return answer["text"], answer["s"], slowest


@pytest.mark.anyio
async def test_query_sql_timeout_stops_a_heavy_query_and_others_are_answered_meanwhile(cache):
    sql = "SELECT sum((a.start_ns + b.end_ns + c.start_ns) % 7) AS s FROM kernels a, kernels b, kernels c"
    text, seconds, slowest = await _heavy_while_another_client_asks(build_server([FIXTURES], cache_dir=cache),
                                                                     sql, 1.5)
    assert "ran past 1.5 s and was stopped" in text and seconds < 1.5 + PROMPT_S
    assert slowest < PROMPT_S


MEMORY = """
import resource, sys, anyio
from pathlib import Path
from mcp.client import Client
from stallhound.server.app import build_server
async def main():
    async with Client(build_server([Path(sys.argv[1])], cache_dir=Path(sys.argv[2]))) as client:
        await client.call_tool("load_profile", {"path": sys.argv[3]})
        result = await client.call_tool("query_sql", {"profile": sys.argv[3], "sql": sys.argv[4], "timeout_s": 60})
        print(result.content[0].text)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
anyio.run(main)
"""
GROWS = ("WITH a AS (SELECT repeat('x', 100000) s), b AS (SELECT s||s||s||s||s||s||s||s||s||s AS s FROM a), "
         "c AS (SELECT s||s||s||s||s||s||s||s||s||s AS s FROM b), d AS (SELECT s||s||s||s||s||s||s||s||s||s AS s "
         "FROM c) SELECT length(s) FROM d, range(100)")  # 100 values of 100 MB: each step passes the static bounds
AGGREGATES = "SELECT length(string_agg(repeat('x', 10000), '')) FROM range(1000000)"  # one 10 GB value


def _peak_of(sql: str, tmp_path: Path, memory_mb: int) -> tuple[str, int]:
    """(the answer, peak RSS in MB) of one query_sql call in a child process with STALLHOUND_MODEL_MEMORY_MB."""
    done = subprocess.run([sys.executable, "-c", MEMORY, str(FIXTURES), str(tmp_path / "cache"), MOCK, sql],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "STALLHOUND_MODEL_MEMORY_MB": str(memory_mb)})
    assert done.returncode == 0, done.stderr[-2000:]
    *answer, peak = done.stdout.splitlines()
    return " ".join(answer), int(peak)


@pytest.mark.parametrize("sql", [GROWS, AGGREGATES])
def test_query_sql_memory_is_bounded_and_the_sentence_names_our_setting(sql, tmp_path):
    answer, peak_mb = _peak_of(sql, tmp_path, SMALL_MEMORY_MB)
    assert f"more than the {SMALL_MEMORY_MB} MB each open profile may use" in answer, answer
    assert "STALLHOUND_MODEL_MEMORY_MB" in answer and "SET " not in answer and "PRAGMA" not in answer
    assert peak_mb < 300 + SMALL_MEMORY_MB + RSS_SLACK_MB, peak_mb  # ~170 MB to start a server and load


@pytest.mark.redteam
@pytest.mark.parametrize("sql", [GROWS, AGGREGATES])
def test_query_sql_memory_is_bounded_at_the_default_limit(sql, tmp_path):
    answer, peak_mb = _peak_of(sql, tmp_path, 600)
    assert "more than the 600 MB each open profile may use" in answer, answer
    assert peak_mb < 300 + 600 + RSS_SLACK_MB, peak_mb


@pytest.mark.redteam
@pytest.mark.anyio
async def test_query_sql_cut_cells_and_rows_before_python_on_a_wide_long_result(cache):
    sql = "SELECT repeat('y', 100000) AS a, repeat('z', 100000) AS b FROM range(1000)"
    async with Client(build_server([FIXTURES], cache_dir=cache)) as client:
        result = await client.call_tool("query_sql", {"profile": MOCK, "sql": sql, "limit": 1000})
    data = result.structured_content
    assert data["row_count"] == 1000 and data["rows"]
    assert all(len(v) < 10_000 and v.endswith(" more characters]") for row in data["rows"] for v in row)


def test_query_sql_parse_errors_keep_no_advice_to_change_settings():
    with pytest.raises(QueryRefused) as refused:
        sql_allow.check("SELECT 1" + " + 1" * 1500, TABLES)
    assert "Max expression depth limit of 1000 exceeded" in str(refused.value)
    assert "SET" not in str(refused.value) and "\n" not in str(refused.value)
