"""The result budget: every tool at its largest limits, through a real MCP client, stays within it (text and
structured content each), says what was cut and which parameter to change; query_sql keeps its values."""

from __future__ import annotations

import json
import re
import sqlite3
import sys

import jsonschema
import pytest
from conftest import FIXTURE_FILES, FIXTURES, text_of
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from stallhound.analysis.contracts import run_skill
from stallhound.cli import main as cli
from stallhound.server import budget
from stallhound.server.app import build_server
from stallhound.tools import TOOL_NAMES, skills

WORST_ARGS = {  # each tool's largest answer: every limit at its maximum, the widest filters
    "gpu_utilization": {"buckets": 200, "limit": 500},
    "top_kernels": {"per_device": True, "limit": 500},
    "gpu_idle_gaps": {"min_gap_ns": 1000, "limit": 500},
    "kernel_launch_overhead": {"threshold_ns": 10**12, "limit": 500},
    "memory_transfers": {"per_device": True, "limit": 500},
    "sync_analysis": {"limit": 500},
    "nccl_breakdown": {"limit": 500},
    "thread_utilization": {"limit": 500},
    "nvtx_breakdown": {"merge_numbers": False, "limit": 500},
    "iterations": {"limit": 500},
    "find_kernels": {"pattern": ".", "regex": True, "limit": 500},
    "query_sql": {"sql": "SELECT * FROM kernels", "limit": 1000},
    "triage": {"limit": 100},
    "show_timeline": {"buckets": 10_000, "limit": 500},
    "unified_memory": {"limit": 500},
    "call_sites": {"events": "api_calls", "full_stacks": 5, "limit": 500},
}
KEPT = re.compile(r"([\d,]+) of ([\d,]+) (\w+)")



@pytest.fixture(scope="module")
def eight_gpus(tmp_path_factory):
    from stallhound import synth
    path = tmp_path_factory.mktemp("eight") / "demo8.sqlite"
    synth.write_sample(path, synth.demo(devices=8))
    return path


@pytest.fixture(scope="module")
def server(cache_root, eight_gpus):
    return build_server([FIXTURES, eight_gpus.parent], cache_dir=cache_root)



def _number(text: str) -> int:
    return int(text.replace(",", ""))


async def _call(server, name: str, args: dict):
    async with Client(server) as client:
        return await client.call_tool(name, args)


def _assert_cut_is_explained(name: str, data: dict, text: str, full: dict) -> None:
    """A cut says by what and which parameter to change; the rows kept are the first rows of the whole answer."""
    if data.get("cut_by") is None:
        assert "cut_note" not in data and data == full, name
        return
    note = data["cut_note"]
    assert "\n" not in note and re.search(r"`(limit|device|table|phase)`|GROUP BY", note), (name, note)
    if data["cut_by"] == "limit":
        assert full.get("truncated") and "`limit`" in note, name
        return
    assert text.endswith(f"cut: {note}") and f"{budget.MAX_RESULT_CHARS:,}-character result budget" in note
    for kept, total, key in KEPT.findall(note):
        assert (_number(kept), _number(total)) == (len(data[key]), len(full[key])), (name, key)
        assert data[key] == full[key][:len(data[key])], (name, key)
    if "truncated" in data and KEPT.search(note):
        assert data["truncated"] is True


@pytest.mark.anyio
@pytest.mark.parametrize("path", [*FIXTURE_FILES, "eight_gpus"], ids=[p.stem for p in FIXTURE_FILES] + ["eight_gpus"])
async def test_budget_every_tool_at_its_largest_limits_fits_and_explains_the_cut(server, path, eight_gpus):
    path = eight_gpus if path == "eight_gpus" else path
    async with Client(server) as client:
        schemas = {t.name: t.output_schema for t in (await client.list_tools()).tools}
        pid = (await client.call_tool("load_profile", {"path": str(path)})).structured_content["profile"]
        for name, module in skills().items():
            args = {"profile": pid, **WORST_ARGS.get(name, {})}
            result = await client.call_tool(name, args)
            if result.is_error:  # only where the profile has no data for the tool
                assert "\n" not in text_of(result) and "characters" not in text_of(result), name
                continue
            data, text = result.structured_content, text_of(result)
            assert len(json.dumps(data)) <= budget.MAX_RESULT_CHARS and len(text) <= budget.MAX_RESULT_CHARS, name
            jsonschema.validate(data, schemas[name])
            with server.store.leased(server.store.sessionless, str(path)) as lease, lease.profile.con.cursor() as cur:
                full = run_skill(cur, module, module.Params(**args)).model_dump(mode="json")
            _assert_cut_is_explained(name, data, text, full)


@pytest.mark.anyio
async def test_budget_query_sql_select_star_at_limit_1000_keeps_real_rows(server):
    path = FIXTURES / "nsysai_mfu_2gpu_after.sqlite"
    result = await _call(server, "query_sql", {"profile": str(path), "sql": "SELECT * FROM kernels", "limit": 1000})
    data = result.structured_content
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        (raw_count,) = raw.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        spans = set(raw.execute("SELECT deviceId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall())
    assert raw_count > 1000 and data["row_count"] == 1000 and data["truncated"] is True
    assert data["cut_by"] == "characters" and 0 < len(data["rows"]) < 1000
    assert f"kept {len(data['rows']):,} of 1,000 rows" in data["cut_note"] and "GROUP BY" in data["cut_note"]
    where = {c: data["columns"].index(c) for c in ("device_id", "start_ns", "end_ns")}
    assert all((r[where["device_id"]], r[where["start_ns"]], r[where["end_ns"]]) in spans for r in data["rows"])
    assert max(len(json.dumps(data)), len(text_of(result))) <= budget.MAX_RESULT_CHARS


@pytest.mark.anyio
async def test_budget_query_sql_one_huge_value_is_cut_not_dropped(server):
    path = str(FIXTURES / "nsysai_mock.sqlite")
    result = await _call(server, "query_sql", {"profile": path, "sql": "SELECT repeat('x', 30000) AS big"})
    data, text = result.structured_content, text_of(result)
    (value,) = data["rows"][0]
    kept = len(value) - len(value.lstrip("x"))
    assert data["row_count"] == 1 and len(data["rows"]) == 1 and data["truncated"] is False
    assert value == "x" * kept + f"... [{30000 - kept:,} more characters]" and kept > 10_000
    assert f"cut 1 long text value to {kept:,} characters" in data["cut_note"]
    assert "0 rows" not in text and "no rows" not in text and "more rows" not in text
    assert max(len(json.dumps(data)), len(text)) <= budget.MAX_RESULT_CHARS


@pytest.mark.anyio
async def test_budget_query_sql_values_round_trip_through_mcp(server):
    sql = ("SELECT 'nan'::DOUBLE AS nan, 'inf'::DOUBLE AS inf, '-inf'::FLOAT AS ninf, [1, NULL, 3] AS list, "
           "{'k': 1, 'v': [0.5, 'nan'::DOUBLE]} AS struct, MAP {'a': 1} AS map, 12.25::DECIMAL(6, 2) AS dec, "
           "170141183460469231731687303715884105727::HUGEINT AS huge, DATE '2024-02-29' AS day, "
           "TIMESTAMP '2024-02-29 01:02:03.5' AS ts, '\\x00A'::BLOB AS blob, NULL AS nothing, true AS yes")
    async with Client(server) as client:
        schema = {t.name: t.output_schema for t in (await client.list_tools()).tools}["query_sql"]
        result = await client.call_tool("query_sql", {"profile": str(FIXTURES / "nsysai_mock.sqlite"), "sql": sql})
    data = result.structured_content
    jsonschema.validate(data, schema)
    assert dict(zip(data["columns"], data["rows"][0], strict=True)) == {
        "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "list": [1, None, 3],
        "struct": {"k": 1, "v": [0.5, "NaN"]}, "map": {"a": 1}, "dec": 12.25,
        "huge": 170141183460469231731687303715884105727, "day": "2024-02-29", "ts": "2024-02-29T01:02:03.500000",
        "blob": "\\x00A", "nothing": None, "yes": True}
    assert data["types"][:4] == ["DOUBLE", "DOUBLE", "FLOAT", "INTEGER[]"] and data["types"][6] == "DECIMAL(6,2)"
    assert "NaN | Infinity | -Infinity | [1, null, 3]" in text_of(result)


@pytest.mark.anyio
async def test_budget_query_sql_errors_keep_duckdbs_hint_and_point_at_describe_schema(server):
    path = str(FIXTURES / "nsysai_mock.sqlite")
    async with Client(server) as client:
        table = await client.call_tool("query_sql", {"profile": path, "sql": "SELECT * FROM kernel"})
        column = await client.call_tool("query_sql", {"profile": path, "sql": "SELECT duration FROM kernels"})
        still = await client.call_tool("query_sql", {"profile": path, "sql": "SELECT count(*) AS n FROM kernels"})
    assert table.is_error and 'Did you mean "kernels"?' in text_of(table) and "describe_schema" in text_of(table)
    assert column.is_error and '"duration_ns"' in text_of(column)
    assert all("\n" not in text_of(r) and "LINE 1" not in text_of(r) for r in (table, column))
    assert still.structured_content["rows"] == [[2]]


@pytest.mark.anyio
async def test_budget_setting_is_honoured_and_a_limit_cut_names_limit(server, monkeypatch):
    path = str(FIXTURES / "nsysai_mfu_2gpu_after.sqlite")
    monkeypatch.setenv(budget.ENV, "6000")
    small = await _call(server, "gpu_idle_gaps", {"profile": path, "min_gap_ns": 1000, "limit": 500})
    data = small.structured_content
    assert max(len(json.dumps(data)), len(text_of(small))) <= 6000
    assert data["cut_by"] == "characters" and "6,000-character result budget" in data["cut_note"]
    assert "lower `limit`" in data["cut_note"] and "raise `limit`" not in text_of(small)
    assert 0 < len(data["gaps"]) < 500 and data["next_offset"] == len(data["gaps"])  # the next page: after those kept
    monkeypatch.delenv(budget.ENV)
    limited = await _call(server, "gpu_idle_gaps", {"profile": path, "min_gap_ns": 1000, "limit": 5})
    data = limited.structured_content
    assert len(data["gaps"]) == 5 and data["gap_count"] > 5 and data["cut_by"] == "limit"
    assert data["cut_note"] == ("more rows exist than `limit`=5 returned; raise `limit` (up to 500) to see more; "
                                "ask again with `offset`=5 for the next page") and data["next_offset"] == 5


def test_budget_cli_prints_everything_unless_the_setting_is_set(capsys, monkeypatch, cache_root):
    path = str(FIXTURES / "nsysai_mfu_2gpu_after.sqlite")
    argv = ["tool", "find_kernels", path, "-p", "pattern=.", "-p", "regex=true", "-p", "limit=500",
            "--json", "--cache-dir", str(cache_root)]
    assert cli.main(argv) == 0
    whole = json.loads(capsys.readouterr().out)
    assert len(whole["rows"]) == 500 and whole["cut_by"] == "limit"
    monkeypatch.setenv(budget.ENV, "8000")
    assert cli.main(argv) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["cut_by"] == "characters" and cut["rows"] == whole["rows"][:len(cut["rows"])]
    monkeypatch.setenv(budget.ENV, "12")
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "STALLHOUND_MAX_RESULT_CHARS='12' is not a number of characters of at least 4,000" in capsys.readouterr().err


@pytest.mark.anyio
async def test_budget_serve_option_sets_the_budget_over_stdio(cache_root):
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "stallhound", "serve", "--root", str(FIXTURES), "--cache-dir", str(cache_root),
        "--max-result-chars", "5000"])
    async with Client(params) as client:
        result = await client.call_tool("nvtx_breakdown", {"profile": str(FIXTURES / "nsysai_mfu_2gpu_after.sqlite"),
                                                          "merge_numbers": False, "limit": 500})
    data = result.structured_content
    assert max(len(json.dumps(data)), len(text_of(result))) <= 5000 and "5,000-character" in data["cut_note"]


def test_budget_covers_every_tool():
    assert set(WORST_ARGS) | {"profile_summary", "describe_schema", "answer_questions"} == set(TOOL_NAMES)
