"""The stacks part of an export's build: nsys' call-stack tables (CUDA_CALLCHAINS, OSRT_CALLCHAINS,
SAMPLING_CALLCHAINS) as the model's deduplicated `stacks`, and the map from each table's chain id to its stack.

nsys shares a chain among the API and OS runtime calls that have the same frames, but writes one per CPU sample;
here chains with the same frames (the same symbol and module, and for an unresolved symbol the same address) get
one stack_id across the three tables, numbered in the order of their first chain. It runs before the activity
tables are written, which join its map; an export without call stacks pays one look at each table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stallhound.formats.frames import native_layer_sql

if TYPE_CHECKING:
    from stallhound.formats.nsys.build import Builder

# Call-stack table -> its source tag in _stack_map (the events that point at it are joined on that tag).
SOURCES = {"CUDA_CALLCHAINS": "cuda", "OSRT_CALLCHAINS": "osrt", "SAMPLING_CALLCHAINS": "sampling"}
COLUMNS = {"id", "symbol", "module", "stackDepth"}  # read without checking once present; unresolved, originalIP
# where the export has them
HELPERS = ("_frames", "_chains", "_stack_keys", "_stack_map")
# Frames of the CUDA calls' chains, read 0 and 1 past each call's callchainId, whose symbol is the call's own
# name: some exports (nsys 2022.2: pipit_saxpy_mpi_a100) count the calls' callchainId from 0 and the chains' ids
# from 1, so the chain at callchainId is the previous call's. The shift that names more calls' own function wins.
CUDA_SHIFT_SQL = """SELECT o.shift, count(*) AS named FROM (SELECT unnest([0, 1]) AS shift) o
  JOIN {runtime} r ON r.callchainId IS NOT NULL JOIN _strings n ON n.id = r.nameId
  JOIN _frames f ON f.source = 'cuda' AND f.id = r.callchainId + o.shift
  JOIN _strings s ON s.id = f.symbol AND s.value = regexp_replace(n.value, '_v[0-9]+$', '')
GROUP BY o.shift ORDER BY named DESC, o.shift LIMIT 1"""
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"


def _col(b: Builder, table: str, name: str) -> str:
    return f'c."{name}"' if name in b.cols(table) else "NULL"


def present(b: Builder) -> list[str]:
    return [t for t in SOURCES if COLUMNS <= b.cols(t) and b.raw.nonempty(t)]


def build(b: Builder) -> None:
    """Write `stacks` and the map _stack_map(source, id, stack_id) from the export's call-stack tables; nsys records
    no Python frames as timed events (python_frames stays empty)."""
    b.create("stacks")
    b.create("python_frames")
    tables = present(b)
    b.has_stacks = set(SOURCES[t] for t in tables)
    if not tables:
        return
    b.sql("CREATE TABLE _frames AS " + " UNION ALL ".join(
        f"""SELECT '{SOURCES[t]}' AS source, c.id, c.stackDepth AS depth, c.symbol, c.module,
                   coalesce({_col(b, t, 'unresolved')}, 0) <> 0 AS unresolved, {_col(b, t, 'originalIP')} AS address
            FROM {b.src(t)} c""" for t in tables))
    b.sql("""CREATE TABLE _chains AS SELECT source, id,
                 list([symbol, module, CASE WHEN unresolved THEN address END] ORDER BY depth) AS key
             FROM _frames GROUP BY source, id""")
    b.sql("""CREATE TABLE _stack_keys AS SELECT key, first.source AS source, first.id AS id,
                 row_number() OVER (ORDER BY first.source, first.id) AS stack_id
             FROM (SELECT key, min({'source': source, 'id': id}) AS first FROM _chains GROUP BY key)""")
    b.sql("""CREATE TABLE _stack_map AS SELECT c.source, c.id, k.stack_id FROM _chains c JOIN _stack_keys k
             USING (key)""")
    b.sql(f"""INSERT INTO stacks
        SELECT k.stack_id, f.depth, s.value, m.value, NULL, 'native', NOT f.unresolved, f.address,
               {native_layer_sql('m.value', 's.value')}
        FROM _stack_keys k JOIN _frames f ON f.source = k.source AND f.id = k.id
        LEFT JOIN _strings s ON s.id = f.symbol LEFT JOIN _strings m ON m.id = f.module""")
    if "cuda" in b.has_stacks and {"callchainId", "nameId"} <= b.cols(RUNTIME):
        shift = b.con.execute(CUDA_SHIFT_SQL.format(runtime=b.src(RUNTIME))).fetchone()
        b.chain_shift = shift[0] if shift else 0


def link(b: Builder, source: str, table: str, column: str) -> tuple[str, str]:
    """(the stack_id expression, the JOIN that provides it) for events `r` of `table` whose `column` holds a chain
    id of `source`; a NULL and no join when the export has no such chains."""
    if source not in b.has_stacks or column not in b.cols(table):
        return "NULL", ""
    shift = b.chain_shift if source == "cuda" else 0
    return "sm.stack_id", f"LEFT JOIN _stack_map sm ON sm.source = '{source}' AND sm.id = r.\"{column}\" + {shift}"
