"""`offset` beside `limit` on the long lists (top_kernels, find_kernels, query_sql, iterations, gpu_idle_gaps):
pages in order, and every "more rows" message names the next offset.
Figures checked against plain SQLite on the raw export, or against the whole list asked for at once."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURES, text_of
from mcp.client import Client

from stallhound.server import budget
from stallhound.server.app import build_server
from stallhound.tools import find_kernels as fk
from stallhound.tools import gpu_idle_gaps as gg
from stallhound.tools import iterations as it
from stallhound.tools import query_sql as qs
from stallhound.tools import top_kernels as tk

CLUE = FIXTURES / "clue_t4_report4.sqlite"  # 100 kernels under 7 demangled names, all with 'kernel' in the name


def _raw(sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{CLUE}?mode=ro", uri=True) as con:
        return con.execute(sql).fetchall()


def _pages(run, page: int) -> list:
    """Every page of `page` rows, following next_offset until there is none."""
    pages, offset = [], 0
    while offset is not None:
        result = run(offset)
        assert result.offset == offset
        pages.append(result)
        offset = result.next_offset
        assert len(pages) <= 1000
    return pages


def test_top_kernels_offset_pages_through_every_name_in_order(open_fixture):
    con = open_fixture("clue_t4_report4").con
    full = tk.run(con, tk.Params(profile="p", limit=500))
    pages = _pages(lambda offset: tk.run(con, tk.Params(profile="p", limit=3, offset=offset)), 3)
    assert [len(p.rows) for p in pages] == [3, 3, 1]
    assert [p.next_offset for p in pages] == [3, 6, None] and [p.truncated for p in pages] == [True, True, False]
    assert [r.name for p in pages for r in p.rows] == [r.name for r in full.rows]
    assert full.total_rows == _raw("SELECT count(DISTINCT demangledName) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0] == 7
    text = tk.render(pages[1])
    assert "... 1 more names: raise `limit` to see them, or ask again with `offset`=6 for the next page" in text
    assert pages[1].hotspots == full.hotspots  # hotspots do not depend on the page


def test_find_kernels_offset_pages_are_the_raw_kernels_in_time_order(open_fixture):
    con = open_fixture("clue_t4_report4").con
    pages = _pages(lambda offset: fk.run(con, fk.Params(profile="p", pattern="kernel", limit=40, offset=offset)), 40)
    assert [len(p.rows) for p in pages] == [40, 40, 20] and [p.next_offset for p in pages] == [40, 80, None]
    raw = _raw("SELECT k.start, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
               "ORDER BY k.start, k.deviceId, k.streamId")
    assert [(r.start_ns, r.name) for p in pages for r in p.rows] == raw
    assert "ask again with `offset`=80 for the next page" in fk.render(pages[1])


def test_iterations_offset_pages_are_the_whole_list_with_indices_that_continue(open_fixture):
    con = open_fixture("nsysai_mfu_2gpu_before").con
    full = it.run(con, it.Params(profile="p", limit=500))
    pages = _pages(lambda offset: it.run(con, it.Params(profile="p", limit=4, offset=offset)), 4)
    assert full.iteration_count > 8 and len(pages) == -(-full.iteration_count // 4)
    assert [r for p in pages for r in p.rows] == full.rows
    assert [r.index for r in full.rows] == list(range(full.iteration_count))
    assert {(p.steady_median_ns, p.iteration_count) for p in pages} == {(full.steady_median_ns, full.iteration_count)}
    assert "ask again with `offset`=8 for the next page" in it.render(pages[1])


def test_gpu_idle_gaps_offset_pages_are_the_longest_gaps_in_order(open_fixture):
    con = open_fixture("clue_t4_report4").con
    args = {"profile": "p", "min_gap_ns": 10_000}
    full = gg.run(con, gg.Params(**args, limit=500))
    pages = _pages(lambda offset: gg.run(con, gg.Params(**args, limit=5, offset=offset)), 5)
    assert full.gap_count == len(full.gaps) > 10 and not full.truncated
    assert [g for p in pages for g in p.gaps] == full.gaps
    assert [p.next_offset for p in pages[:2]] == [5, 10] and pages[-1].next_offset is None
    assert f"... {full.gap_count - 10:,} more gaps: raise `limit` to see them, or ask again with `offset`=10" \
        in gg.render(pages[1])


def test_query_sql_offset_skips_rows_in_the_querys_own_order(open_fixture):
    con = open_fixture("clue_t4_report4").con
    sql = "SELECT start_ns, duration_ns FROM kernels ORDER BY duration_ns DESC, start_ns"
    raw = [list(r) for r in _raw("SELECT start, end - start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 2 DESC, 1")]
    page = qs.run(con, qs.Params(profile="p", sql=sql, limit=5, offset=10))
    assert page.rows == raw[10:15] and page.next_offset == 15 and page.truncated
    assert "ask again with `offset`=15 for the next page" in qs.render(page)
    last = qs.run(con, qs.Params(profile="p", sql=sql, limit=5, offset=95))
    assert last.rows == raw[95:] and last.next_offset is None and not last.truncated
    past = qs.run(con, qs.Params(profile="p", sql=sql, limit=5, offset=20_000))
    assert past.rows == [] and past.next_offset is None


def test_query_sql_offset_after_a_budget_cut_continues_after_the_rows_kept(open_fixture):
    con = open_fixture("clue_t4_report4").con
    params = qs.Params(profile="p", sql="SELECT * FROM kernels ORDER BY start_ns", limit=100, offset=7)
    text, cut = budget.fit(qs.run(con, params), qs, params, 6_000)
    assert cut.cut_by == "characters" and 0 < len(cut.rows) < 93
    assert cut.next_offset == 7 + len(cut.rows)
    resumed = qs.run(con, qs.Params(profile="p", sql=params.sql, limit=1, offset=cut.next_offset))
    assert resumed.rows[0][resumed.columns.index("start_ns")] == _raw(
        "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start")[cut.next_offset][0]


@pytest.mark.anyio
async def test_top_kernels_offset_over_mcp_names_the_next_page_and_refuses_a_negative_one(cache_root):
    async with Client(build_server([FIXTURES], cache_dir=cache_root)) as client:
        page = await client.call_tool("top_kernels", {"profile": str(CLUE), "limit": 2, "offset": 2})
        bad = await client.call_tool("top_kernels", {"profile": str(CLUE), "offset": -1})
    data = page.structured_content
    assert (data["offset"], data["next_offset"], len(data["rows"])) == (2, 4, 2)
    assert data["cut_by"] == "limit" and data["cut_note"].endswith("ask again with `offset`=4 for the next page")
    assert bad.is_error and "offset" in text_of(bad) and "\n" not in text_of(bad)
