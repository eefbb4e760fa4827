"""The NVTX part of an export's build: NVTX_EVENTS scanned once into a staging table, the push/pop depths
computed from narrow reads of it, window by window of time (profiles.nvtx_depth), then the model's nvtx table
written from both.

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
HELPERS = ("_nvtx", "_nvtx_kinds")  # staging tables, dropped once the model is written
DEPTH_VIEW = "_nvtx_depth"  # the depths, a NumPy column registered on the cursor for the final insert

# Closed push/pop ranges read at once. A window's NumPy arrays (about 7 int64 columns of its opens and closes, plus
# the sorts' temporaries) sit beside DuckDB's own memory, whatever the export's size: on the 1 GB export's 8.4M
# ranges, depth alone peaked at +68 MB RSS with 250k (+118 MB at 500k, +182 MB at 1M) for 0.1-0.2 s more CPU.
WINDOW_RANGES = 250_000
HISTOGRAM_BINS = 4096  # start-time bins counted to place the windows' cuts
CLOSED = "kind = 'push_pop' AND end_ns >= start_ns"  # the ranges that have a depth
OPENS_SQL = f"""SELECT rowid AS rid, coalesce(gtid, -1) AS gtid, start_ns, end_ns FROM _nvtx
                WHERE {CLOSED} AND start_ns >= $lo AND start_ns < $hi"""
CLOSES_SQL = f"""SELECT coalesce(gtid, -1) AS gtid, start_ns, end_ns FROM _nvtx
                 WHERE {CLOSED} AND end_ns >= $lo AND end_ns < $hi"""

MODEL_SQL = f"""
INSERT INTO nvtx
WITH domains AS (SELECT domain_id, any_value(text) AS name FROM _nvtx WHERE kind = 'domain' GROUP BY domain_id)
SELECT ((n.gtid >> 24) & 16777215)::BIGINT AS pid, (n.gtid & 16777215)::BIGINT AS tid,
       d.name AS domain, n.text, n.start_ns, CASE WHEN n.end_ns >= n.start_ns THEN n.end_ns END AS end_ns,
       CASE WHEN n.end_ns >= n.start_ns THEN n.end_ns - n.start_ns END AS duration_ns, n.kind,
       nullif(x.depth, {nvtx_depth.NO_DEPTH})
FROM _nvtx n POSITIONAL JOIN {DEPTH_VIEW} x
LEFT JOIN domains d ON d.domain_id = n.domain_id AND n.domain_id <> 0
WHERE n.kind <> 'domain'"""


def stage(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """Scan NVTX_EVENTS once (the largest table of most exports) into a staging table, each event type decoded
    once into its model kind (NVTX_KINDS) rather than compared as text per row later."""
    t = "NVTX_EVENTS"
    b.sql("""CREATE TABLE _nvtx (gtid BIGINT, start_ns BIGINT, end_ns BIGINT, kind VARCHAR, text VARCHAR,
             domain_id BIGINT)""", cur)
    if not b.raw.has(t):
        return
    kinds = " ".join(f"WHEN '{label}' THEN '{kind}'" for label, kind in NVTX_KINDS.items())
    b.sql(f"""CREATE TABLE _nvtx_kinds AS SELECT code, CASE label {kinds} END AS kind FROM enums
              WHERE enum = 'ENUM_NSYS_EVENT_TYPE' AND label IN (SELECT unnest($labels))""", cur,
          {"labels": list(NVTX_KINDS)})
    text = checks.UTF8_TEXT_SQL.format(col="r.text")
    b.sql(f"""INSERT INTO _nvtx SELECT r.globalTid, r.start, r."end", k.kind, coalesce({text}, s.value),
            {b.col(t, "domainId", "0")}
        FROM {b.src(t)} r JOIN _nvtx_kinds k ON k.code = r.eventType
        LEFT JOIN _strings s ON s.id = {b.col(t, "textId")}""", cur)


def write(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """The model's nvtx table: the staged rows with their depths, paired by position (joining them back on row id
    cost as much as computing them)."""
    try:
        depth = depths(cur)
    except duckdb.InterruptException as exc:
        raise b.cancelled_error() from exc
    b.create("nvtx", cur)
    cur.register(DEPTH_VIEW, {"depth": depth})
    try:
        b.sql(MODEL_SQL, cur)
    finally:
        cur.unregister(DEPTH_VIEW)


def depths(cur: duckdb.DuckDBPyConnection) -> np.ndarray:
    """Each staged row's depth by row id (NO_DEPTH where none), window by window of time (see profiles.nvtx_depth)."""
    out = np.full(cur.execute("SELECT count(*) FROM _nvtx").fetchone()[0], nvtx_depth.NO_DEPTH, dtype=np.int16)
    gtids = cur.execute(f"SELECT DISTINCT coalesce(gtid, -1) AS gtid FROM _nvtx WHERE {CLOSED} ORDER BY 1"
                        ).fetchnumpy()["gtid"]
    carry = np.zeros(len(gtids), dtype=np.int64)
    for lo, hi in _windows(cur):
        opens = cur.execute(OPENS_SQL, {"lo": lo, "hi": hi}).fetchnumpy()
        closes = cur.execute(CLOSES_SQL, {"lo": lo, "hi": hi}).fetchnumpy()
        window = nvtx_depth.Window(opens["rid"], np.searchsorted(gtids, opens["gtid"]), opens["start_ns"],
                                   opens["end_ns"], np.searchsorted(gtids, closes["gtid"]), closes["start_ns"],
                                   closes["end_ns"])
        del opens, closes
        rid, depth = nvtx_depth.window_depths(window, carry)
        if len(depth) and depth.max() > np.iinfo(out.dtype).max:
            out = out.astype(np.int32)  # nesting deeper than int16 holds: rare, so the common case keeps 2 bytes a row
        out[rid] = depth
    return out


def _windows(cur: duckdb.DuckDBPyConnection) -> list[tuple[int, int]]:
    """[lo, hi) start times covering every closed range, each window opening about WINDOW_RANGES of them; the last
    reaches past the last end, so that every close falls in a window."""
    total, lo, last_start, last_end = cur.execute(
        f"SELECT count(*), min(start_ns), max(start_ns), max(end_ns) FROM _nvtx WHERE {CLOSED}").fetchone()
    if not total:
        return []
    width = (last_start - lo) // HISTOGRAM_BINS + 1
    bins = cur.execute(f"""SELECT (start_ns - $lo) // $width AS bin, count(*) AS n FROM _nvtx WHERE {CLOSED}
                           GROUP BY bin ORDER BY bin""", {"lo": lo, "width": width}).fetchnumpy()
    running = np.cumsum(bins["n"])
    # a window ends before the bin where the running count passes another WINDOW_RANGES
    passes = np.searchsorted(running, np.arange(WINDOW_RANGES, total, WINDOW_RANGES), side="right")
    cuts = np.unique(lo + bins["bin"][passes] * width).tolist()
    edges = [lo, *(c for c in cuts if c > lo), last_end + 1]
    return list(zip(edges[:-1], edges[1:], strict=True))
