"""The NVTX part of an export's build: NVTX_EVENTS scanned once into a staging table, the push/pop depths
computed from a narrow read of it (profiles.nvtx_depth), then the model's nvtx table written from both.

It runs on the build's host-side thread, beside the GPU tables, on that thread's cursor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from nsightful.profiles import checks, nvtx_depth

if TYPE_CHECKING:
    from nsightful.profiles.ingest import Builder

# NVTX event types the model keeps, as the kind they become (domain: a domain's name, kept only to name the others).
NVTX_KINDS = {"NvtxPushPopRange": "push_pop", "NvtxtPushPopRange": "push_pop", "NvtxStartEndRange": "start_end",
              "NvtxtStartEndRange": "start_end", "NvtxMark": "mark", "NvtxtMark": "mark", "NvtxDomainCreate": "domain"}
HELPERS = ("_nvtx", "_nvtx_kinds")  # staging tables, dropped once the model is written
DEPTH_VIEW = "_nvtx_depth"  # the depths, a NumPy column registered on the cursor for the final insert

# The closed push/pop ranges with their row ids, each thread as a small integer (any order: depth counts per thread).
RANGES_SQL = """
SELECT n.rowid AS rid, t.thread, n.start_ns, n.end_ns FROM _nvtx n
JOIN (SELECT gtid, (row_number() OVER () - 1)::BIGINT AS thread FROM (SELECT DISTINCT gtid FROM _nvtx)) t
  ON t.gtid IS NOT DISTINCT FROM n.gtid
WHERE n.kind = 'push_pop' AND n.end_ns >= n.start_ns"""

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
    rows = cur.execute("SELECT count(*) FROM _nvtx").fetchone()[0]
    ranges = _fetch(b, cur)
    depth = nvtx_depth.depths(rows, ranges.pop("rid"), ranges.pop("thread"), ranges.pop("start_ns"),
                              ranges.pop("end_ns"))
    b.create("nvtx", cur)
    cur.register(DEPTH_VIEW, {"depth": depth})
    try:
        b.sql(MODEL_SQL, cur)
    finally:
        cur.unregister(DEPTH_VIEW)


def _fetch(b: Builder, cur: duckdb.DuckDBPyConnection) -> dict:
    try:
        return cur.execute(RANGES_SQL).fetchnumpy()
    except duckdb.InterruptException as exc:
        raise b.cancelled_error() from exc
