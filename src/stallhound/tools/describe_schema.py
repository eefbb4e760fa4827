"""What tables and columns does the profile model have (for query_sql)?

Without `table`: every canonical table with its meaning, its row count in this profile and its column
names. With `table`: that table's columns with their types and meaning. Times are ns on the export's clock,
sizes bytes (the full text is also the resource stallhound://schema).
"""

from __future__ import annotations

from typing import Annotated

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import Output, ProfileParams
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest
from stallhound.model.schema import TABLE_NAMES, TABLES


class Params(ProfileParams):
    table: Annotated[str | None, Field(description="One table to describe column by column (types and meaning); "
                                                   "omit for every table with its column names")] = None


class Column(BaseModel):
    name: str
    type: str
    description: str


class TableInfo(BaseModel):
    name: str
    description: str
    rows: int = Field(description="rows in this profile")
    columns: list[str]
    details: list[Column] | None = Field(None, description="the columns in full, for the table asked for")


class Result(Output):
    profile: str
    tables: list[TableInfo]


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    if params.table is not None and params.table not in TABLE_NAMES:
        raise InvalidRequest(f"no table {params.table!r} in the profile model (tables: {', '.join(TABLE_NAMES)}); "
                             "omit table to list them all")
    tables = []
    for table in TABLES:
        if params.table not in (None, table.name):
            continue
        counted = one_row(con.execute(f"SELECT count(*) FROM {table.name}"))  # names are our constants
        rows = counted[0]
        details = ([Column(name=n, type=t, description=d) for n, t, d in table.columns]
                   if params.table == table.name else None)
        tables.append(TableInfo(name=table.name, description=table.doc, rows=rows,
                                columns=[c[0] for c in table.columns], details=details))
    return Result(profile=params.profile, tables=tables)


def render(result: Result) -> str:
    out = []
    for t in result.tables:
        out.append(f"{t.name} ({t.rows:,} rows): {t.description}")
        if t.details is None:
            out.append(f"  columns: {', '.join(t.columns)}")
        else:
            out.extend(f"  {c.name} {c.type}" + (f" -- {c.description}" if c.description else "") for c in t.details)
    if len(result.tables) > 1:
        out.append("describe one table with `table` for its column types and meanings")
    return "\n".join(out)
