"""The NVTX part of an export's build: the closed push/pop ranges staged narrow (SQLite row id, thread, start, end)
from one scan of NVTX_EVENTS, their depths computed window by window of time (profiles.nvtx_depth) into a table
keyed by row id, then the model's nvtx table written from a second scan with the depths joined on row id.

Each event's text is written once, into the model: writing 8.4M texts cost about 3-4 s of CPU on the 1 GB export,
more than the second scan (about 1.6 s), so staging only the narrow columns halves the text work. Domain names come
from the few NvtxDomainCreate rows, read with sqlite3 (a DuckDB scan of the whole table would read every text).

It runs on the build's host-side thread, beside the GPU tables, on that thread's cursor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb
import numpy as np

from nsightful.profiles import checks, nvtx_depth

if TYPE_CHECKING:
    from nsightful.profiles.ingest import Builder

# NVTX event types the model keeps, as the kind they become (domain: a domain's name, kept only to name the others).
NVTX_KINDS = {"NvtxPushPopRange": "push_pop", "NvtxtPushPopRange": "push_pop", "NvtxStartEndRange": "start_end",
              "NvtxtStartEndRange": "start_end", "NvtxMark": "mark", "NvtxtMark": "mark", "NvtxDomainCreate": "domain"}
DEPTHS = "_nvtx_depth"  # (rid, depth) of every closed push/pop range
HELPERS = ("_nvtx", "_nvtx_kinds", "_nvtx_domains", DEPTHS)  # staging tables, dropped once the model is written
WINDOW_VIEW = "_nvtx_window"  # one window's depths, NumPy columns registered on the cursor while they are inserted

# Closed push/pop ranges read at once. A window's NumPy arrays (about 7 int64 columns of its opens and closes, plus
# the sorts' temporaries) sit beside DuckDB's own memory, whatever the export's size: on the 1 GB export's 8.4M
# ranges, depth alone peaked at +68 MB RSS with 250k (+118 MB at 500k, +182 MB at 1M) for 0.1-0.2 s more CPU.
WINDOW_RANGES = 250_000
HISTOGRAM_BINS = 4096  # start-time bins counted to place the windows' cuts
OPENS_SQL = "SELECT rid, gtid, start_ns, end_ns FROM _nvtx WHERE start_ns >= $lo AND start_ns < $hi"
CLOSES_SQL = "SELECT gtid, start_ns, end_ns FROM _nvtx WHERE end_ns >= $lo AND end_ns < $hi"
# Domain names as the scanner would read them: bytes that are not UTF-8 become \xNN escapes (see checks.UTF8_TEXT_SQL)
DOMAIN_NAME_SQL = "coalesce(try(decode(text)), CAST(text AS VARCHAR), s.value)"


def stage(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """The closed push/pop ranges, narrow, from one scan of NVTX_EVENTS (the largest table of most exports), each
    event type decoded once into its model kind (NVTX_KINDS); and the domains' names."""
    t = "NVTX_EVENTS"
    b.sql("CREATE TABLE _nvtx (rid BIGINT, gtid BIGINT, start_ns BIGINT, end_ns BIGINT)", cur)
    b.sql(f"CREATE TABLE {DEPTHS} (rid BIGINT, depth INTEGER)", cur)
    b.sql("CREATE TABLE _nvtx_domains (domain_id BIGINT, name VARCHAR)", cur)
    if not b.raw.has(t):
        return
    kinds = " ".join(f"WHEN '{label}' THEN '{kind}'" for label, kind in NVTX_KINDS.items())
    b.sql(f"""CREATE TABLE _nvtx_kinds AS SELECT code, CASE label {kinds} END AS kind FROM enums
              WHERE enum = 'ENUM_NSYS_EVENT_TYPE' AND label IN (SELECT unnest($labels))""", cur,
          {"labels": list(NVTX_KINDS)})
    b.sql(f"""INSERT INTO _nvtx SELECT r.rowid, coalesce(r.globalTid, -1), r.start, r."end"
              FROM {b.src(t)} r JOIN _nvtx_kinds k ON k.code = r.eventType
              WHERE k.kind = 'push_pop' AND r."end" >= r.start""", cur)
    _domains(b, cur)


def _domains(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """Each domain's name (its first NvtxDomainCreate row's text), read with sqlite3: the rows are few."""
    codes = [c for (c,) in cur.execute("SELECT code FROM _nvtx_kinds WHERE kind = 'domain'").fetchall()]
    cols = b.cols("NVTX_EVENTS")
    if not codes or "domainId" not in cols:
        return
    text_id = '"textId"' if "textId" in cols else "NULL"
    table = b.raw.real_name("NVTX_EVENTS")
    rows = b.raw.con.execute(f"""SELECT "domainId", CAST(text AS BLOB), {text_id} FROM "{table}"
                                 WHERE "eventType" IN ({", ".join("?" * len(codes))})""", codes).fetchall()
    if not rows:
        return
    ids, texts, text_ids = (list(c) for c in zip(*rows, strict=True))
    b.sql(f"""INSERT INTO _nvtx_domains SELECT domain_id, any_value({DOMAIN_NAME_SQL})
              FROM (SELECT unnest($ids) AS domain_id, unnest($texts::BLOB[]) AS text, unnest($text_ids) AS text_id)
              LEFT JOIN _strings s ON s.id = text_id GROUP BY domain_id""", cur,
          {"ids": ids, "texts": texts, "text_ids": text_ids})


def write(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """The model's nvtx table from a second scan, the depths joined on the SQLite row id."""
    try:
        depths(cur)
    except duckdb.InterruptException as exc:
        raise b.cancelled_error() from exc
    b.create("nvtx", cur)
    t = "NVTX_EVENTS"
    if not b.raw.has(t):
        return
    text = checks.UTF8_TEXT_SQL.format(col="r.text")
    domain_id = b.col(t, "domainId", "0")
    b.sql(f"""INSERT INTO nvtx
        SELECT ((r.globalTid >> 24) & 16777215)::BIGINT AS pid, (r.globalTid & 16777215)::BIGINT AS tid,
               d.name AS domain, coalesce({text}, s.value), r.start,
               CASE WHEN r."end" >= r.start THEN r."end" END AS end_ns,
               CASE WHEN r."end" >= r.start THEN r."end" - r.start END AS duration_ns, k.kind, x.depth
        FROM {b.src(t)} r JOIN _nvtx_kinds k ON k.code = r.eventType
        LEFT JOIN _strings s ON s.id = {b.col(t, "textId")}
        LEFT JOIN _nvtx_domains d ON d.domain_id = {domain_id} AND {domain_id} <> 0
        LEFT JOIN {DEPTHS} x ON x.rid = r.rowid
        WHERE k.kind <> 'domain'""", cur)


def depths(cur: duckdb.DuckDBPyConnection) -> None:
    """Each staged range's depth into DEPTHS, window by window of time (see profiles.nvtx_depth): memory bounded
    by a window, not the export."""
    gtids = cur.execute("SELECT DISTINCT gtid FROM _nvtx ORDER BY 1").fetchnumpy()["gtid"]
    carry = np.zeros(len(gtids), dtype=np.int64)
    for lo, hi in _windows(cur):
        opens = cur.execute(OPENS_SQL, {"lo": lo, "hi": hi}).fetchnumpy()
        closes = cur.execute(CLOSES_SQL, {"lo": lo, "hi": hi}).fetchnumpy()
        window = nvtx_depth.Window(opens["rid"], np.searchsorted(gtids, opens["gtid"]), opens["start_ns"],
                                   opens["end_ns"], np.searchsorted(gtids, closes["gtid"]), closes["start_ns"],
                                   closes["end_ns"])
        del opens, closes
        rid, depth = nvtx_depth.window_depths(window, carry)
        cur.register(WINDOW_VIEW, {"rid": rid, "depth": depth})
        try:
            cur.execute(f"INSERT INTO {DEPTHS} SELECT rid, depth FROM {WINDOW_VIEW}")
        finally:
            cur.unregister(WINDOW_VIEW)


def _windows(cur: duckdb.DuckDBPyConnection) -> list[tuple[int, int]]:
    """[lo, hi) start times covering every staged range, each window opening about WINDOW_RANGES of them; the last
    reaches past the last end, so that every close falls in a window."""
    total, lo, last_start, last_end = cur.execute(
        "SELECT count(*), min(start_ns), max(start_ns), max(end_ns) FROM _nvtx").fetchone()
    if not total:
        return []
    width = (last_start - lo) // HISTOGRAM_BINS + 1
    bins = cur.execute("""SELECT (start_ns - $lo) // $width AS bin, count(*) AS n FROM _nvtx
                          GROUP BY bin ORDER BY bin""", {"lo": lo, "width": width}).fetchnumpy()
    running = np.cumsum(bins["n"])
    # a window ends before the bin where the running count passes another WINDOW_RANGES
    passes = np.searchsorted(running, np.arange(WINDOW_RANGES, total, WINDOW_RANGES), side="right")
    cuts = np.unique(lo + bins["bin"][passes] * width).tolist()
    edges = [lo, *(c for c in cuts if c > lo), last_end + 1]
    return list(zip(edges[:-1], edges[1:], strict=True))
