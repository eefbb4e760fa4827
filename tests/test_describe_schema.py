"""describe_schema: the model's tables with their row counts, one table in full on request."""

from __future__ import annotations

import pytest

from stallhound.model.errors import InvalidRequest
from stallhound.model.schema import TABLE_NAMES, TABLES
from stallhound.tools import describe_schema as ds


def test_describe_schema_lists_every_table_with_its_rows(open_fixture):
    con = open_fixture("clue_t4_report4").con
    result = ds.run(con, ds.Params(profile="c"))
    assert [t.name for t in result.tables] == list(TABLE_NAMES)
    for t in result.tables:
        assert t.rows == con.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0] and t.details is None
    assert next(t for t in result.tables if t.name == "kernels").rows == 100
    assert len(result.model_dump_json()) + len(ds.render(result)) < 20_000


def test_describe_schema_one_table_in_full(open_fixture):
    result = ds.run(open_fixture("clue_t4_report4").con, ds.Params(profile="c", table="memcpy"))
    [table] = result.tables
    [model] = [t for t in TABLES if t.name == "memcpy"]
    assert [(c.name, c.type, c.description) for c in table.details] == list(model.columns)
    assert "src_kind VARCHAR -- " in ds.render(result)


def test_describe_schema_unknown_table_names_the_valid_ones(open_fixture):
    with pytest.raises(InvalidRequest, match="no table 'kernel'.*kernels, memcpy"):
        ds.run(open_fixture("clue_t4_report4").con, ds.Params(profile="c", table="kernel"))
