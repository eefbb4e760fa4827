"""Run one read-only SQL query over the profile model, for what the other tools don't cover.

One statement starting with SELECT, WITH, DESCRIBE or EXPLAIN (DuckDB dialect) over the
tables listed by describe_schema. No file or network access, no settings changes. Rows are
capped at `limit`, and the server cuts rows (then long text values) to fit its result budget;
the query is interrupted after `timeout_s`. Cells keep their values as JSON: see `rows`.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import threading
from decimal import Decimal
from typing import Annotated, Any

import duckdb
from pydantic import Field

from stallhound.analysis.common import OffsetParam, Paged, ProfileParams, more_rows, next_page
from stallhound.model.errors import QueryRefused

MAX_ROWS = 1000  # rows: more belongs in an aggregate, not in a model's context
SKIP_BATCH_ROWS = 10_000  # rows read and dropped at a time while skipping to `offset`: bounded memory
MAX_TIMEOUT_S = 60
ALLOWED_START = ("select", "with", "describe", "explain")
LEADING_NOISE = re.compile(r"^(\s+|--[^\n]*\n?|/\*.*?\*/|\()+", re.S)
DUCKDB_POINTER = re.compile(r"\n\s*LINE \d+:.*", re.S)  # DuckDB's echo of the statement and a caret under it
NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
CUT_HINT = "select fewer or shorter columns, or aggregate (GROUP BY) instead of listing rows"  # read by the budget
CELLS = ("cells as JSON: numbers, text, true/false, null; NaN, Infinity and -Infinity as those strings; lists as "
         "arrays; structs and maps as objects (map keys as text); DECIMAL as numbers; dates, times and timestamps "
         "as ISO 8601 text; intervals and UUIDs as text; BLOBs as text with \\xHH escapes; `types` names each "
         "column's DuckDB type")


class Params(ProfileParams):
    sql: Annotated[str, Field(description="One DuckDB SELECT/WITH/DESCRIBE/EXPLAIN statement over the model "
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


def sql_error(exc: duckdb.Error) -> str:
    """DuckDB's message without its statement echo, on one line: keeps hints such as 'Did you mean "kernels"?'."""
    return " ".join(line.strip() for line in DUCKDB_POINTER.sub("", str(exc)).splitlines() if line.strip())


def check_statement(sql: str) -> None:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(f"the SQL does not parse ({sql_error(exc)}); fix the syntax") from exc
    if len(statements) != 1:
        raise QueryRefused(f"send exactly one statement (got {len(statements)}); split them into separate calls")
    first = LEADING_NOISE.sub("", sql).split(None, 1)[0].lower() if sql.strip() else ""
    allowed = statements[0].type in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)
    if not allowed or first not in ALLOWED_START:
        raise QueryRefused(f"only SELECT, WITH, DESCRIBE or EXPLAIN queries are allowed (got '{first.upper()}'); "
                           "the model is read-only and settings, files and extensions are off limits")


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
    check_statement(params.sql)
    timer = threading.Timer(params.timeout_s, con.interrupt)
    timer.start()
    try:
        cur = con.execute(params.sql)
        _skip(cur, params.offset)
        rows = cur.fetchmany(params.limit + 1)
        description = cur.description or []
    except duckdb.InterruptException as exc:
        raise QueryRefused(f"the query ran past {params.timeout_s:g} s and was stopped; aggregate more or add "
                           "a WHERE on start_ns") from exc
    except duckdb.OutOfMemoryException:
        raise  # worded by model.limits.model_memory, which names our setting, not DuckDB's SET memory_limit
    except duckdb.Error as exc:
        raise QueryRefused(f"the query failed ({sql_error(exc)}); describe_schema lists the tables and "
                           "their columns") from exc
    finally:
        timer.cancel()
    shown = [[cell(v) for v in row] for row in rows[:params.limit]]
    return Result(profile=params.profile, columns=[d[0] for d in description], types=[str(d[1]) for d in description],
                  rows=shown, row_count=len(shown), truncated=len(rows) > params.limit,
                  offset=params.offset, next_offset=next_page(params.offset, len(shown), len(rows) > params.limit))


def _skip(cur: duckdb.DuckDBPyConnection, rows: int) -> None:
    """Read past the first `rows` rows of the query's answer (in its own order), a batch at a time."""
    while rows > 0:
        skipped = len(cur.fetchmany(min(rows, SKIP_BATCH_ROWS)))
        if not skipped:
            return
        rows -= skipped


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
