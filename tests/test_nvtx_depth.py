"""NVTX push/pop depth as the build computes it (formats.nsys.nvtx, formats.nsys.nvtx_depth): against planted nesting
(ranges added to a copy of a real export on a thread of their own, each with the depth a per-thread stack gives it),
and row for row against the ordered SQL window it replaced, on every fixture and on random ties."""

from __future__ import annotations

import random
import shutil
import sqlite3

import duckdb
import pytest
from conftest import FIXTURE_FILES, FIXTURES
from modeldb import bulk_insert

from stallhound.formats import open_profile
from stallhound.formats.nsys import nvtx as nvtx_build
from stallhound.formats.nsys.raw import RawExport
from stallhound.model.schema import ddl

EXPORT = FIXTURES / "nsysai_h100_2gpu_1s.sqlite"
PID, TID, OTHER_TID = 4242, 7, 8
PUSH_POP, START_END, MARK = "NvtxPushPopRange", "NvtxStartEndRange", "NvtxMark"
# (text, start, end, event type, thread, depth the model must give it)
PLANTED = [
    ("outer", 1000, 2000, PUSH_POP, TID, 0),
    ("twin a", 1100, 1500, PUSH_POP, TID, 1),
    ("twin b", 1100, 1500, PUSH_POP, TID, 2),  # same times as its twin: nested inside it, in row order
    ("inner", 1200, 1300, PUSH_POP, TID, 3),
    ("after twins", 1500, 1600, PUSH_POP, TID, 1),  # the twins close at 1500 before it opens
    ("zero length", 1600, 1600, PUSH_POP, TID, 1),  # opens as 'after twins' closes, closes after it opens
    ("top zero length", 2500, 2500, PUSH_POP, TID, 0),
    ("mark", 1250, None, MARK, TID, None),
    ("start/end", 1050, 1900, START_END, TID, None),
    ("unclosed", 1700, None, PUSH_POP, TID, None),
    ("other thread", 900, 2100, PUSH_POP, OTHER_TID, 0),  # its own stack: the ranges above do not count
    ("other inner", 1150, 1160, PUSH_POP, OTHER_TID, 1),
]


def _planted_export(tmp_path):
    path = tmp_path / EXPORT.name
    shutil.copy(EXPORT, path)
    with sqlite3.connect(path) as con:
        codes = dict(con.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE").fetchall())
        con.executemany('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)',
                        [(s, e, codes[kind], text, (PID << 24) | tid) for text, s, e, kind, tid, _ in PLANTED])
    return path


def test_profiles_nvtx_depth_follows_each_threads_stack(tmp_path):
    profile = open_profile(_planted_export(tmp_path), cache_dir=tmp_path / "cache")
    try:
        got = dict(profile.con.execute("SELECT text, depth FROM nvtx WHERE pid = ?", [PID]).fetchall())
        others = profile.con.execute("SELECT count(*), count(depth), min(depth) FROM nvtx WHERE pid <> ?",
                                     [PID]).fetchone()
    finally:
        profile.close()
    assert got == {text: depth for text, *_, depth in PLANTED}
    with sqlite3.connect(f"file:{EXPORT}?mode=ro", uri=True) as raw:
        pushed = raw.execute("SELECT count(*) FROM NVTX_EVENTS e JOIN ENUM_NSYS_EVENT_TYPE t ON t.id = e.eventType "
                             "WHERE t.name = ? AND e.\"end\" >= e.start", [PUSH_POP]).fetchone()[0]
        total = raw.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
    assert others == (total, pushed, 0)  # the export's own ranges keep a depth each, from 0


# --- the depth rule against the ordered SQL window it replaced ----------------------------------------------------
# The build's depth until issue 14 (one running sum over all opens and closes in (thread, time, turn) order), kept
# as the reference the sorted-key computation must equal row for row.
REFERENCE_SQL = """
WITH ranges AS (SELECT rowid AS rid, (pid << 24) | tid AS gtid, start_ns, end_ns,
                       kind = 'push_pop' AND end_ns >= start_ns AS opens FROM nvtx),
events AS (SELECT rid, gtid, start_ns AS t, 1 AS step, 1 AS turn, end_ns AS tie FROM ranges WHERE opens
           UNION ALL SELECT NULL, gtid, end_ns, -1, CASE WHEN end_ns = start_ns THEN 2 ELSE 0 END, 0
           FROM ranges WHERE opens),
running AS (SELECT rid, step, sum(step) OVER (ORDER BY gtid, t, turn, tie DESC, rid
                                              ROWS UNBOUNDED PRECEDING) AS open_now FROM events)
SELECT rid, (open_now - 1)::INTEGER AS depth FROM running WHERE step = 1"""
NVTX_KIND = {PUSH_POP: "push_pop", "NvtxtPushPopRange": "push_pop", START_END: "start_end", MARK: "mark"}


def _staged(rows: list[tuple]) -> duckdb.DuckDBPyConnection:
    """A model nvtx table as the build stages it, before its depths, holding `rows` (globalTid, start, end, kind) in
    their order; the model keeps end_ns only where end >= start."""
    con = duckdb.connect()
    con.execute(ddl("nvtx"))
    if rows:
        bulk_insert(con, "nvtx", ("pid", "tid", "start_ns", "end_ns", "kind"),
                    [(None if g is None else g >> 24 & 0xFFFFFF, None if g is None else g & 0xFFFFFF, s,
                      e if e is not None and e >= s else None, kind) for g, s, e, kind in rows])
    return con


def _compared(con: duckdb.DuckDBPyConnection) -> tuple[list, list]:
    """(depth by row id as the build fills it in, from the reference SQL), NULL where a row has none."""
    expected = dict(con.execute(REFERENCE_SQL).fetchall())
    nvtx_build.fill_depths(con)
    got = con.execute("SELECT rowid, depth FROM nvtx ORDER BY rowid").fetchall()
    return [depth for _, depth in got], [expected.get(rid) for rid, _ in got]


def _export_rows(path) -> list[tuple]:
    """The export's NVTX events in row order, as staged: (globalTid, start, end, kind)."""
    names, _ = RawExport(path).enum("ENUM_NSYS_EVENT_TYPE")  # the export's own, else nsys' codes
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        if not raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone():
            return []
        events = raw.execute('SELECT globalTid, start, "end", eventType FROM NVTX_EVENTS ORDER BY rowid').fetchall()
    return [(tid, start, end, NVTX_KIND.get(names.get(code), "other")) for tid, start, end, code in events]


def _windows(path) -> list:
    """The default window, and 1,000 ranges (many windows) on every fixture."""
    return [pytest.param(path, window, id=f"{path.stem}-{window}") for window in (nvtx_build.WINDOW_RANGES, 1000)]


@pytest.mark.parametrize(("path", "window"), [p for path in FIXTURE_FILES for p in _windows(path)])
def test_profiles_nvtx_depth_equals_the_reference_sql_on_every_fixture(path, window, monkeypatch):
    monkeypatch.setattr(nvtx_build, "WINDOW_RANGES", window)  # 1000: the fixtures' ranges over up to 20 windows
    got, expected = _compared(_staged(_export_rows(path)))
    assert got == expected


def test_profiles_nvtx_depth_equals_the_reference_sql_on_planted_ties():
    rows = [((PID << 24) | tid, s, e, NVTX_KIND[kind]) for _, s, e, kind, tid, _ in PLANTED]
    got, expected = _compared(_staged(rows))
    assert got == expected == [depth for *_, depth in PLANTED]


def _random_rows(rng: random.Random, count: int, spread: int) -> list[tuple]:
    """Ranges on a few threads with times drawn from a small set, so that ties of every kind are common."""
    rows = []
    for _ in range(count):
        start = rng.randrange(spread)
        end = rng.choice([start, start + rng.randrange(1, spread), None, start - 1])
        kind = rng.choice(["push_pop"] * 6 + ["start_end", "mark"])
        rows.append((rng.choice([1 << 24 | 5, 1 << 24 | 6, 9 << 24 | 5, None]), start, end, kind))
    return rows


@pytest.mark.parametrize("window", [nvtx_build.WINDOW_RANGES, 7])
@pytest.mark.parametrize("seed", range(20))
def test_profiles_nvtx_depth_equals_the_reference_sql_on_random_ties(seed, window, monkeypatch):
    monkeypatch.setattr(nvtx_build, "WINDOW_RANGES", window)  # 7: ranges open across many windows' edges
    got, expected = _compared(_staged(_random_rows(random.Random(seed), 300, 40)))
    assert got == expected


def test_profiles_nvtx_depth_ranks_times_too_far_apart_to_pack(monkeypatch):
    monkeypatch.setattr(nvtx_build, "WINDOW_RANGES", 10**9)  # one window spans both ends
    far = 2**62  # threads x span x turns no longer fit an int64 key: the times are ranked first
    rows = [(t << 24, base + s, base + e, "push_pop") for t in range(1, 5) for base in (0, far)
            for s, e in ((0, 100), (10, 20), (10, 20), (20, 20), (20, 50), (100, 100))]
    got, expected = _compared(_staged(rows))
    assert got == expected
    assert got[:6] == [0, 1, 2, 2, 1, 0]  # the twins close at 20 before the ranges opening there; outer first


def test_profiles_nvtx_depth_of_no_ranges_is_empty():
    assert _compared(_staged([])) == ([], [])
    assert _compared(_staged([(1, 5, None, "push_pop"), (1, 7, None, "mark")])) == ([None, None], [None, None])


def test_profiles_nvtx_depth_deeper_than_int16(monkeypatch):
    monkeypatch.setattr(nvtx_build, "WINDOW_RANGES", 10_000)
    monkeypatch.setattr(nvtx_build, "UPDATE_ROWS", 15_000)  # filled in by several UPDATEs
    deep = 33_000  # one thread nesting past 32,767
    rows = [(1 << 24, i, 2 * deep - i, "push_pop") for i in range(deep)]
    got, expected = _compared(_staged(rows))
    assert got == expected == list(range(deep))
