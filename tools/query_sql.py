"""Run one read-only SQL query over the profile model, for what the other tools don't cover.

One statement starting with SELECT, WITH, DESCRIBE or EXPLAIN (DuckDB dialect) over the
tables listed by describe_schema. No file or network access, no settings changes. Rows are
capped at `limit` and text at MAX_RESULT_CHARS; the query is interrupted after `timeout_s`.
"""

from __future__ import annotations

import re
import threading
from typing import Annotated, Any

import duckdb
from pydantic import BaseModel, Field

from nsightful.profiles.errors import InvalidRequest
from nsightful.tools.common import ProfileParams

MAX_ROWS = 1000  # rows: more belongs in an aggregate, not in a model's context
MAX_RESULT_CHARS = 20_000  # characters of cell text returned, to fit a model's context
MAX_TIMEOUT_S = 60
ALLOWED_START = ("select", "with", "describe", "explain")
LEADING_NOISE = re.compile(r"^(\s+|--[^\n]*\n?|/\*.*?\*/|\()+", re.S)


class QueryRefused(InvalidRequest):
    pass


class Params(ProfileParams):
    sql: Annotated[str, Field(description="One DuckDB SELECT/WITH/DESCRIBE/EXPLAIN statement over the model "
                                          "tables (see describe_schema); bind no parameters", min_length=1)]
    limit: Annotated[int, Field(description=f"Maximum rows returned (1-{MAX_ROWS})", ge=1, le=MAX_ROWS)] = 100
    timeout_s: Annotated[float, Field(description=f"Interrupt the query after this many seconds "
                                                  f"(max {MAX_TIMEOUT_S})", gt=0, le=MAX_TIMEOUT_S)] = 10.0


class Result(BaseModel):
    profile: str
    columns: list[str]
    rows: list[list[Any]]
    row_count: int = Field(description="rows returned")
    truncated: bool = Field(description="true when more rows or text existed than were returned")


def check_statement(sql: str) -> None:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(f"the SQL does not parse ({str(exc).splitlines()[0]}); fix the syntax") from exc
    if len(statements) != 1:
        raise QueryRefused(f"send exactly one statement (got {len(statements)}); split them into separate calls")
    first = LEADING_NOISE.sub("", sql).split(None, 1)[0].lower() if sql.strip() else ""
    allowed = statements[0].type in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)
    if not allowed or first not in ALLOWED_START:
        raise QueryRefused(f"only SELECT, WITH, DESCRIBE or EXPLAIN queries are allowed (got '{first.upper()}'); "
                           "the model is read-only and settings, files and extensions are off limits")


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    check_statement(params.sql)
    timer = threading.Timer(params.timeout_s, con.interrupt)
    timer.start()
    try:
        cur = con.execute(params.sql)
        rows = cur.fetchmany(params.limit + 1)
        columns = [d[0] for d in cur.description or []]
    except duckdb.InterruptException as exc:
        raise QueryRefused(f"the query ran past {params.timeout_s:g} s and was stopped; aggregate more or add "
                           "a WHERE on start_ns") from exc
    except duckdb.Error as exc:
        raise QueryRefused(f"the query failed: {str(exc).splitlines()[0]}") from exc
    finally:
        timer.cancel()
    truncated = len(rows) > params.limit
    out, used = [], 0
    for row in rows[:params.limit]:
        cells = [v if isinstance(v, int | float | bool | type(None)) else str(v) for v in row]
        used += sum(len(str(c)) for c in cells)
        if used > MAX_RESULT_CHARS:
            truncated = True
            break
        out.append(cells)
    return Result(profile=params.profile, columns=columns, rows=out, row_count=len(out), truncated=truncated)


def render(result: Result) -> str:
    lines = [" | ".join(result.columns)]
    lines.extend(" | ".join("NULL" if c is None else str(c) for c in row) for row in result.rows)
    if result.truncated:
        lines.append(f"... cut at {result.row_count} rows: raise `limit` or aggregate")
    return "\n".join(lines)
