"""What tables and columns does the profile model have (for query_sql)?

Lists every canonical table with its columns, types and meaning, and each table's row count
in this profile. Times are ns on the export's clock, sizes bytes.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from nsightful.profiles.model import TABLES
from nsightful.tools.common import ProfileParams


class Params(ProfileParams):
    pass


class Column(BaseModel):
    name: str
    type: str
    description: str


class TableInfo(BaseModel):
    name: str
    description: str
    rows: int = Field(description="rows in this profile")
    columns: list[Column]


class Result(BaseModel):
    profile: str
    tables: list[TableInfo]


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    tables = []
    for table in TABLES:
        rows = con.execute(f"SELECT count(*) FROM {table.name}").fetchone()[0]  # names are our constants
        tables.append(TableInfo(name=table.name, description=table.doc, rows=rows,
                                columns=[Column(name=n, type=t, description=d) for n, t, d in table.columns]))
    return Result(profile=params.profile, tables=tables)


def render(result: Result) -> str:
    out = []
    for t in result.tables:
        out.append(f"{t.name} ({t.rows:,} rows): {t.description}")
        out.extend(f"  {c.name} {c.type}" + (f" -- {c.description}" if c.description else "") for c in t.columns)
    return "\n".join(out)
