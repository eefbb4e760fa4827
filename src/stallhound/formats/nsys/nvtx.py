"""The NVTX part of an export's build: NVTX_EVENTS scanned once into the model's nvtx table, then the push/pop
depths computed from narrow reads of it, window by window of time (formats.nsys.nvtx_depth), and filled in by row id.

It runs on the build's host-side thread, beside the GPU tables, on that thread's cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from stallhound.formats.nsys import checks, nvtx_depth
from stallhound.model.duck import one_row

if TYPE_CHECKING:
    from stallhound.formats.nsys.build import Builder

# NVTX event types the model keeps, as the kind they become (domain: a domain's name, kept only to name the others).
NVTX_KINDS = {"NvtxPushPopRange": "push_pop", "NvtxtPushPopRange": "push_pop", "NvtxStartEndRange": "start_end",
              "NvtxtStartEndRange": "start_end", "NvtxMark": "mark", "NvtxtMark": "mark", "NvtxDomainCreate": "domain"}
HELPERS = ("_nvtx_kinds",)  # staging tables, dropped once the model is written
DOMAIN_ID = "domain_id"  # the raw domain id, a column of nvtx only until the domains are named
DEPTHS_VIEW = "_nvtx_depths"  # a batch of (row id, depth), a NumPy frame registered on the cursor for its UPDATE

# Closed push/pop ranges read at once. A window's NumPy arrays (about 7 int64 columns of its opens and closes, plus
# the sorts' temporaries) sit beside DuckDB's own memory, whatever the export's size: a bounded window keeps that
# memory small for a little more CPU.
WINDOW_RANGES = 250_000
# Depths written by one UPDATE (an UPDATE holds its old values until it commits): within the build, beside the GPU
# tables, batches this size are as fast as larger ones and keep the build's peak memory lower and steadier.
UPDATE_ROWS = 250_000
HISTOGRAM_BINS = 4096  # start-time bins counted to place the windows' cuts
CLOSED = "kind = 'push_pop' AND end_ns >= start_ns"  # the ranges that have a depth (end_ns is NULL when unclosed)
THREAD = "coalesce((pid << 24) | tid, -1)"  # one key per thread; NULL threads share -1
# A window's opens (start in [lo, hi)) and closes (end in [lo, hi)) in one read: the ranges meeting it, spanning
# ones left out by the caller (one read rather than one per kind: the reads dominate the depths' time).
WINDOW_SQL = f"""SELECT rowid AS rid, {THREAD} AS thread, start_ns, end_ns FROM nvtx
                 WHERE {CLOSED} AND start_ns < $hi AND end_ns >= $lo"""
UPDATE_SQL = f"""UPDATE nvtx SET depth = x.depth FROM {DEPTHS_VIEW} x
                 WHERE nvtx.rowid = x.rid AND nvtx.start_ns >= $lo AND nvtx.start_ns < $hi"""
DOMAINS_SQL = f"""
UPDATE nvtx SET domain = d.name
FROM (SELECT {DOMAIN_ID} AS id, any_value(text) AS name FROM nvtx WHERE kind = 'domain' GROUP BY id) d
WHERE nvtx.{DOMAIN_ID} = d.id AND d.id <> 0 AND nvtx.kind <> 'domain'"""


def stage(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """Scan NVTX_EVENTS once (the largest table of most exports) into the model's nvtx table, with the raw domain
    ids beside it and no depths yet; each event type decoded once into its model kind (NVTX_KINDS) rather than
    compared as text per row."""
    t = "NVTX_EVENTS"
    b.create("nvtx", cur)
    b.sql(f"ALTER TABLE nvtx ADD COLUMN {DOMAIN_ID} BIGINT", cur)
    if not b.raw.has(t):
        return
    kinds = " ".join(f"WHEN '{label}' THEN '{kind}'" for label, kind in NVTX_KINDS.items())
    b.sql(f"""CREATE TABLE _nvtx_kinds AS SELECT code, CASE label {kinds} END AS kind FROM enums
              WHERE enum = 'ENUM_NSYS_EVENT_TYPE' AND label IN (SELECT unnest($labels))""", cur,
          {"labels": list(NVTX_KINDS)})
    text = checks.UTF8_TEXT_SQL.format(col="r.text")
    closed = 'r."end" >= r.start'
    b.sql(f"""INSERT INTO nvtx BY NAME SELECT (r.globalTid >> 24) & 16777215 AS pid, r.globalTid & 16777215 AS tid,
            coalesce({text}, s.value) AS text, r.start AS start_ns,
            CASE WHEN {closed} THEN r."end" END AS end_ns, CASE WHEN {closed} THEN r."end" - r.start END AS duration_ns,
            k.kind, {b.col(t, "domainId", "0")} AS {DOMAIN_ID}
        FROM {b.src(t)} r JOIN _nvtx_kinds k ON k.code = r.eventType
        LEFT JOIN _strings s ON s.id = {b.col(t, "textId")}""", cur)


def write(b: Builder, cur: duckdb.DuckDBPyConnection) -> None:
    """The staged nvtx table made the model's: depths filled in, domains named, the domain rows and ids dropped."""
    try:
        fill_depths(cur)
    except duckdb.InterruptException as exc:
        raise b.cancelled_error() from exc
    b.sql(DOMAINS_SQL, cur)
    b.sql("DELETE FROM nvtx WHERE kind = 'domain'", cur)
    b.sql(f"ALTER TABLE nvtx DROP COLUMN {DOMAIN_ID}", cur)


def fill_depths(cur: duckdb.DuckDBPyConnection) -> None:
    """Each closed push/pop range's depth written into nvtx (the rest keep NULL), UPDATE_ROWS at a time."""
    batch: list[tuple[np.ndarray, np.ndarray]] = []
    since = None
    for lo, hi, rid, depth in depths(cur):
        since = lo if since is None else since
        batch.append((rid, depth))
        if sum(len(r) for r, _ in batch) >= UPDATE_ROWS:
            _update(cur, batch, since, hi)
            since = None
    if since is not None:
        _update(cur, batch, since, hi)


def _update(cur: duckdb.DuckDBPyConnection, batch: list[tuple[np.ndarray, np.ndarray]], lo: int, hi: int) -> None:
    """The batch's depths written; its ranges all start in [lo, hi), which spares the UPDATE the rest of the table."""
    cur.register(DEPTHS_VIEW, {"rid": np.concatenate([r for r, _ in batch]),
                               "depth": np.concatenate([d for _, d in batch])})
    batch.clear()
    try:
        cur.execute(UPDATE_SQL, {"lo": lo, "hi": hi})
    finally:
        cur.unregister(DEPTHS_VIEW)


def depths(cur: duckdb.DuckDBPyConnection) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Per window of time [lo, hi) (see formats.nsys.nvtx_depth): lo, hi, and the row ids and depths of nvtx's closed
    push/pop ranges starting in it."""
    threads = cur.execute(f"SELECT DISTINCT {THREAD} AS thread FROM nvtx WHERE {CLOSED} ORDER BY 1"
                          ).fetchnumpy()["thread"]
    carry = np.zeros(len(threads), dtype=np.int64)
    for lo, hi in _windows(cur):
        rows = cur.execute(WINDOW_SQL, {"lo": lo, "hi": hi}).fetchnumpy()
        thread = np.searchsorted(threads, rows["thread"])
        opens, closes = rows["start_ns"] >= lo, rows["end_ns"] < hi
        window = nvtx_depth.Window(rows["rid"][opens], thread[opens], rows["start_ns"][opens], rows["end_ns"][opens],
                                   thread[closes], rows["start_ns"][closes], rows["end_ns"][closes])
        del rows, thread, opens, closes
        yield lo, hi, *nvtx_depth.window_depths(window, carry)


def _windows(cur: duckdb.DuckDBPyConnection) -> list[tuple[int, int]]:
    """[lo, hi) start times covering every closed range, each window opening about WINDOW_RANGES of them; the last
    reaches past the last end, so that every close falls in a window."""
    # bounds of every event, not only the closed ranges': DuckDB answers them from its column statistics, where the
    # closed ranges' would need a scan
    lo, last_start, last_end = one_row(cur.execute("SELECT min(start_ns), max(start_ns), max(end_ns) FROM nvtx"))
    if lo is None:
        return []
    width = (last_start - lo) // HISTOGRAM_BINS + 1
    bins = cur.execute(f"""SELECT (start_ns - $lo) // $width AS bin, count(*) AS n FROM nvtx WHERE {CLOSED}
                           GROUP BY bin ORDER BY bin""", {"lo": lo, "width": width}).fetchnumpy()
    if not len(bins["n"]):
        return []
    running = np.cumsum(bins["n"])
    total = int(running[-1])
    # a window ends before the bin where the running count passes another WINDOW_RANGES
    passes = np.searchsorted(running, np.arange(WINDOW_RANGES, total, WINDOW_RANGES), side="right")
    cuts = np.unique(lo + bins["bin"][passes] * width).tolist()
    edges = [lo, *(c for c in cuts if c > lo), last_end + 1]
    return list(zip(edges[:-1], edges[1:], strict=True))
