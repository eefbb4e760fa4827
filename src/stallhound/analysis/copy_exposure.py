"""How long each copy runs with no kernel on its device: its length less the union of that device's kernels inside it.

Per (direction, device), over the copies whose start lies in the window ($start, $end, $devices): the exposed time of
all of them, of the pageable ones (pageable when either side is) and of the pageable ones that pay for their staging
(rules.PAGEABLE_STAGED_BYTES or more). One device and one time chunk of copies at a
time (the copies between a first and last start, and the kernels starting among them, at most ROWS_PER_CHUNK rows),
with analysis/cover.py for each copy's covered time: memory stays flat on the largest exports.
"""

from __future__ import annotations

import duckdb
import numpy as np

from stallhound.analysis import cover, device_pass, rules
from stallhound.model.duck import one_row

CHUNKS_SQL = """
SELECT device_id, count(*), min(start_ns), max(start_ns) FROM memcpy
WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end GROUP BY ALL
"""
KERNELS_AMONG_SQL = "SELECT count(*) FROM kernels WHERE device_id = $device AND start_ns BETWEEN $lo AND $hi"
CHUNK_COPIES_SQL = """
SELECT start_ns AS s, end_ns AS e, (list_position($directions, direction) - 1) * 3
       + CASE WHEN NOT coalesce('pageable' IN (src_kind, dst_kind), false) THEN 0
              WHEN """ + rules.staged_sql("bytes") + """ THEN 2 ELSE 1 END AS g
FROM memcpy WHERE device_id = $device AND start_ns >= $start AND start_ns < $end AND start_ns BETWEEN $lo AND $hi
"""
CHUNK_KERNELS_SQL = """
SELECT start_ns AS s, end_ns AS e FROM kernels
WHERE device_id = $device AND end_ns > $lo AND start_ns < $until AND end_ns > start_ns
"""
ROWS_PER_CHUNK = 1_000_000  # copies and kernels read at a time: memory stays flat on the largest exports


def exposed(con: duckdb.DuckDBPyConnection, args: dict, directions: list[str]
            ) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(exposed ns, pageable exposed ns, staged pageable exposed ns) per (direction, device), for each device with
    copies in the window and each of `directions` (the directions of those copies; 0 where a device has none)."""
    out: dict[tuple[str, int], tuple[int, int, int]] = {}
    for device, n, first, last in con.execute(CHUNKS_SQL, args).fetchall():
        among = one_row(con.execute(KERNELS_AMONG_SQL, {"device": device, "lo": first, "hi": last}))
        total = _device(con, {"start": args["start"], "end": args["end"], "device": device,
                              "directions": directions}, n + among[0], first, last)
        for i, direction in enumerate(directions):
            kinds = total[3 * i:3 * i + 3]  # not pageable, pageable below the staged size, staged
            out[direction, device] = (int(kinds.sum()), int(kinds[1:].sum()), int(kinds[2]))
    return out


def _device(con: duckdb.DuckDBPyConnection, args: dict, rows: int, first: int, last: int) -> np.ndarray:
    """One device's exposed copy time per group (direction index x 3 + host memory kind), over chunks of copies."""
    total = np.zeros(3 * len(args["directions"]), dtype=np.int64)
    for lo, hi in device_pass.chunk_edges(rows, first, last, ROWS_PER_CHUNK):
        c = con.execute(CHUNK_COPIES_SQL, {**args, "lo": lo, "hi": hi}).fetchnumpy()
        if not len(c["s"]):
            continue
        k = con.execute(CHUNK_KERNELS_SQL, {"device": args["device"], "lo": lo, "until": int(c["e"].max())}
                        ).fetchnumpy()
        exposed_ns = c["e"] - c["s"] - cover.covered(c["s"], c["e"], k["s"], k["e"])
        for g in np.unique(c["g"]).tolist():  # a few groups: integer sums, exact
            total[g] += int(exposed_ns[c["g"] == g].sum())
    return total
