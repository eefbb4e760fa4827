"""Run one read-only SQL query over the profile model, for what the other tools don't cover.

One SELECT or WITH query (DuckDB dialect), or DESCRIBE of one, over the tables and views listed by
describe_schema; other statements (EXPLAIN, COPY, SET, PRAGMA, CALL, ATTACH, ...) are refused. Allowed:
plain values, columns, operators, CASE/CAST, subqueries, joins, CTEs (not recursive), windows, and the vetted
scalar and aggregate functions (arithmetic, text, time, list, map, struct and JSON functions, aggregates);
the only table functions are range, generate_series (up to 1,000,000 rows) and unnest. No file, network,
setting, logging, variable or catalog access. Rows are capped at `limit`; long text cells are cut in SQL
before they are read (each result holds at most 10 million characters) and the server cuts rows (then long
text values) to fit its result budget; the query is interrupted after `timeout_s`, or when it grows the
server's memory by more than each open profile may use (STALLHOUND_MODEL_MEMORY_MB). Cells keep their values
as JSON: see `rows`.
"""

from __future__ import annotations

import datetime
import json
import math
import mmap
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import duckdb
from pydantic import Field

from stallhound.analysis.common import OffsetParam, Paged, ProfileParams, more_rows, next_page
from stallhound.model.errors import QueryRefused
from stallhound.model.limits import MODEL_MEMORY_ENV, model_memory_mb
from stallhound.model.sql_allow import check, sql_error

MAX_ROWS = 1000  # rows: more belongs in an aggregate, not in a model's context
MAX_TIMEOUT_S = 60
MAX_COLUMNS = 500  # columns: the widest model table has a few dozen; bounds a result with the per-cell cap below
# characters held before Python converts a result: 500 times what the server's budget shows, so that the budget,
# not this cap, picks the rows to keep; long text cells are cut in SQL to their share of it.
MAX_RESULT_CHARS = 10_000_000
MAX_CELL_CHARS = 100_000  # characters of one text cell at most, whatever its share: more is never shown
MIN_CELL_CHARS = 100  # characters a text cell keeps however many there are: enough to tell values apart
MAX_LIST_ITEMS = 10_000  # items of one list cell: more is never shown
WATCH_POLL_S = 0.02  # between checks of the clock and of memory while the query runs
STATM = Path("/proc/self/statm")  # the process's resident pages (Linux); elsewhere only the clock is watched
PAGE_BYTES = mmap.PAGESIZE
NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
CUT_HINT = "select fewer or shorter columns, or aggregate (GROUP BY) instead of listing rows"  # read by the budget
CELLS = ("cells as JSON: numbers, text, true/false, null; NaN, Infinity and -Infinity as those strings; lists as "
         "arrays; structs and maps as objects (map keys as text); DECIMAL as numbers; dates, times and timestamps "
         "as ISO 8601 text; intervals and UUIDs as text; BLOBs as text with \\xHH escapes; `types` names each "
         "column's DuckDB type")
MODEL_TABLES = (  # two queries: their UNION takes ten times as long (10 ms) as both
    "SELECT lower(table_name) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main'",
    "SELECT lower(view_name) FROM duckdb_views() WHERE database_name = current_database() AND schema_name = 'main' "
    "AND NOT internal")


class Params(ProfileParams):
    sql: Annotated[str, Field(description="One DuckDB SELECT/WITH query (or DESCRIBE of one) over the model "
                                          "tables (see describe_schema); bind no parameters", min_length=1)]
    limit: Annotated[int, Field(description=f"Maximum rows returned (1-{MAX_ROWS})", ge=1, le=MAX_ROWS)] = 100
    offset: OffsetParam = 0
    timeout_s: Annotated[float, Field(description=f"Interrupt the query after this many seconds "
                                                  f"(max {MAX_TIMEOUT_S})", gt=0, le=MAX_TIMEOUT_S)] = 10.0


class Result(Paged):
    profile: str
    columns: list[str]
    types: list[str] = Field(description="DuckDB type of each column, e.g. BIGINT, DOUBLE, VARCHAR[]")
    rows: list[list[Any]] = Field(description=CELLS)
    row_count: int = Field(description="rows the query gave, counted up to `limit`; `rows` holds fewer when the "
                                       "result budget cut them (cut_by='characters')")
    truncated: bool = Field(description="true when more rows existed than were returned")


def cell(value: Any) -> Any:
    """A DuckDB value as JSON data that keeps its value (see CELLS)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE.get(value, "NaN")
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list | tuple):
        return [cell(v) for v in value]
    if isinstance(value, dict):
        return {str(k): cell(v) for k, v in value.items()}
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in value)
    return str(value)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    watch = _Watch(con, params.timeout_s)
    try:
        with watch:
            check(params.sql, {name for sql in MODEL_TABLES for (name,) in con.execute(sql).fetchall()})
            rel = _bounded(con.sql(params.sql), params)
            rows = rel.execute().fetchmany(params.limit + 1)
            columns, types = rel.columns, [str(t) for t in rel.types]
    except duckdb.InterruptException as exc:
        raise watch.refusal() from exc
    except duckdb.OutOfMemoryException:
        raise  # the server's model_memory names our setting
    except duckdb.Error as exc:
        raise QueryRefused(f"the query failed ({sql_error(exc)}); describe_schema lists the tables and "
                           "their columns") from exc
    shown = [[cell(v) for v in row] for row in rows[:params.limit]]
    return Result(profile=params.profile, columns=columns, types=types,
                  rows=shown, row_count=len(shown), truncated=len(rows) > params.limit,
                  offset=params.offset, next_offset=next_page(params.offset, len(shown), len(rows) > params.limit))


def _bounded(rel: duckdb.DuckDBPyRelation, params: Params) -> duckdb.DuckDBPyRelation:
    """The query's rows from `offset`, `limit` + 1 of them, with long text cut to its share of MAX_RESULT_CHARS and
    long lists to MAX_LIST_ITEMS, in SQL: nothing larger reaches Python."""
    if len(rel.columns) > MAX_COLUMNS:
        raise QueryRefused(f"the query returns {len(rel.columns):,} columns, over query_sql's {MAX_COLUMNS}; "
                           "select the columns you need")
    types = [str(t) for t in rel.types]
    texts = sum(t == "VARCHAR" for t in types) or 1
    share = min(MAX_CELL_CHARS, max(MIN_CELL_CHARS, MAX_RESULT_CHARS // ((params.limit + 1) * texts)))
    cut = [_cut(f"#{i}", kind, share) + f' AS "{name.replace(chr(34), chr(34) * 2)}"'
           for i, (name, kind) in enumerate(zip(rel.columns, types, strict=True), start=1)]
    return rel.project(", ".join(cut)).limit(params.limit + 1, params.offset)


def _cut(column: str, kind: str, chars: int) -> str:
    if kind == "VARCHAR":
        return (f"CASE WHEN length({column}) > {chars} THEN left({column}, {chars}) || '... [' || "
                f"format('{{:,}}', length({column}) - {chars}) || ' more characters]' ELSE {column} END")
    if kind.endswith("[]"):
        return f"{column}[1:{MAX_LIST_ITEMS}]"
    return column


class _Watch:
    """Interrupts the query when it runs past `timeout_s` or grows the process's memory by more than each open
    profile may use, from a thread of its own; says which in one sentence."""

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout_s: float):
        self._con, self._timeout_s, self._stop = con, timeout_s, threading.Event()
        self._limit_bytes = model_memory_mb() * 2**20
        self.cause = ""
        self._thread = threading.Thread(target=self._watch, name="query_sql watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        deadline, start = time.monotonic() + self._timeout_s, _rss_bytes()
        while not self._stop.wait(WATCH_POLL_S):
            if time.monotonic() > deadline:
                self.cause = "time"
            elif _rss_bytes() - start > self._limit_bytes:
                self.cause = "memory"
            if self.cause:
                self._con.interrupt()
                return

    def refusal(self) -> QueryRefused:
        if self.cause == "memory":
            limit = model_memory_mb()
            return QueryRefused(f"the query needed more than the {limit:,} MB each open profile may use and was "
                                f"stopped; aggregate more or add a WHERE on start_ns, or set {MODEL_MEMORY_ENV} "
                                f"higher (e.g. {max(2 * limit, 2000):,}) and restart stallhound")
        return QueryRefused(f"the query ran past {self._timeout_s:g} s and was stopped; aggregate more or add a "
                            "WHERE on start_ns")


def _rss_bytes() -> int:
    """The process's resident memory, or 0 where /proc is absent."""
    try:
        return int(STATM.read_text().split()[1]) * PAGE_BYTES
    except OSError:
        return 0


def _text(value: Any) -> str:
    return "NULL" if value is None else value if isinstance(value, str) else json.dumps(value)


def render(result: Result) -> str:
    lines = [" | ".join(result.columns)]
    lines.extend(" | ".join(_text(c) for c in row) for row in result.rows)
    if not result.rows:
        lines.append("(no rows)")
    if result.truncated:
        lines.extend(more_rows(result, None, "rows", "raise `limit` or aggregate"))
    return "\n".join(lines)
