"""How long the devices were busy inside each of a list of spans: the union of their kernel, memcpy and memset
intervals in the span, summed over the devices (busy as gpu_utilization counts it)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import duckdb

from stallhound.analysis.common import packed, unpacked
from stallhound.analysis.intervals import GPU_WORK, covered, overlaps

BUSY_SQL = "WITH " + GPU_WORK + """,
its AS (SELECT unnest(""" + unpacked("$starts") + """) AS start_ns, unnest(""" + unpacked("$ends") + """) AS end_ns,
               generate_subscripts(""" + unpacked("$starts") + """, 1) - 1 AS idx),
probes AS (SELECT row_number() OVER () AS probe_id, i.*, d.device_id
           FROM its i, (SELECT unnest($devices) AS device_id) d),
""" + overlaps("pieces", "probes", "gpu_work", "device_id") + ",\n" + covered("cov", "pieces") + """
SELECT p.idx, sum(coalesce(c.ns, 0)) FROM probes p LEFT JOIN cov c USING (probe_id) GROUP BY p.idx
"""


def busy_ns(con: duckdb.DuckDBPyConnection, devices: list[int], spans: Sequence[tuple[int, int]],
            buckets: int) -> list[int]:
    """Busy ns of `devices` inside each span, summed over the devices; `buckets` overlap-join buckets per typical
    span."""
    if not spans or not devices:
        return [0] * len(spans)
    bucket = int(max(1000, statistics.median(e - s for s, e in spans) // buckets))
    args = {"devices": devices, "starts": packed(s for s, _ in spans), "ends": packed(e for _, e in spans),
            "start": min(s for s, _ in spans), "end": max(e for _, e in spans), "bucket_ns": bucket}
    busy = dict(con.execute(BUSY_SQL, args).fetchall())
    return [int(busy.get(i, 0)) for i in range(len(spans))]
