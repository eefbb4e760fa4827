"""Interval union in SQL, shared by the skills that ask "when was the GPU busy?".

Everything here is CTE text: no value is formatted in (the window and devices stay the bound
parameters `$start`, `$end`, `$devices`), and the names, sources and keys passed to the functions
must be constants of the calling module. Compose with `"WITH " + GPU_WORK + ",\n" + gaps(...)`.

- GPU_WORK: `gpu_work(device_id, stream_id, kind, start_ns, end_ns)`, every kernel ('kernel'), memcpy
  ('memcpy'), memset ('memset') and whole CUDA graph execution ('graph': graphs traced at graph level,
  whose kernels have no rows of their own) of the devices in `$devices` that overlaps [$start, $end),
  clipped to it; zero-length operations are dropped. GPU_WORK_CATEGORY: the same rows with a number
  `cat` (kernel categories apart) instead of `kind`.
- islands(name, source, keys): `name(<keys>, start_ns, end_ns)`, the union of the intervals of
  `source(<keys>, start_ns, end_ns)` per key as disjoint maximal islands (overlapping or touching
  intervals merge), so busy time = sum(end_ns - start_ns).
- pieces(name, source, keys): `name(<keys>, start_ns, end_ns)`, the union of `source`'s intervals per key as
  disjoint pieces (not maximal: touching pieces stay apart), from one sorted pass and no grouping; cheaper
  than islands() when only the covered time matters (per key, or per time bucket).
- gaps(name, source, keys): `name(<keys>, start_ns, end_ns)`, the idle stretches between consecutive
  islands of a key (positive length; none before the first or after the last interval).
- overlaps(name, probes, events, keys, payload): `name(probe_id, <payload>, start_ns, end_ns)`, the
  pieces where a probe `probes(probe_id, <keys>, start_ns, end_ns)` and an event `events(<keys>, start_ns,
  end_ns, <payload>)` with the same keys overlap (positive length). Summing piece lengths gives the
  overlap time; merging a probe's pieces with islands() gives its intersection with the events' union.
  It joins on time buckets of `$bucket_ns` by equality instead of a range join: an event no longer
  than a bucket joins on the bucket it starts in (probes cover their buckets and the one before), a
  longer one on every bucket it covers (pieces clipped to the bucket). No sort; rows grow with the
  buckets a probe or long event covers and the events per bucket, so pick $bucket_ns near the typical
  event length.
- covered(name, pieces): `name(probe_id, ns)`, per probe the length of the union of its overlap
  pieces (from overlaps()): each piece adds what lies past the furthest end before it.
- BUSY: GPU_WORK plus `busy(device_id, start_ns, end_ns)`, the device busy islands (any work).
"""

from __future__ import annotations


def _gpu_work(name: str, kind: str, labels: tuple[str, str, str, str], where: str = "") -> str:
    kernel, memcpy, memset, graph = labels
    return f"""{name} AS (
  SELECT device_id, stream_id, {kind}, greatest(start_ns, $start) AS start_ns, least(end_ns, $end) AS end_ns
  FROM (SELECT device_id, stream_id, {kernel} AS {kind}, start_ns, end_ns FROM kernels
        UNION ALL SELECT device_id, stream_id, {memcpy}, start_ns, end_ns FROM memcpy
        UNION ALL SELECT device_id, stream_id, {memset}, start_ns, end_ns FROM memset
        UNION ALL SELECT device_id, stream_id, {graph}, start_ns, end_ns FROM graph_exec)
  WHERE device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end AND end_ns > start_ns{where})"""


GPU_WORK = _gpu_work("gpu_work", "kind", ("'kernel'", "'memcpy'", "'memset'", "'graph'"))
# The same rows with `cat` instead of the kind's name (a number is cheaper to read): 0 a compute kernel or graph
# execution, 1 a copy-like kernel (casts, copies), 2 a memcpy or memset, 3 an NCCL kernel
CATEGORY_LABELS = ("CASE WHEN category = 'nccl' THEN 3 WHEN category = 'copy' THEN 1 ELSE 0 END", "2", "2", "0")
GPU_WORK_CATEGORY = _gpu_work("gpu_work", "cat", CATEGORY_LABELS)
# One device's rows starting (unclipped) in [$raw_lo, $hi]: on the stored start, so that each table's scan skips the
# row groups outside it (a filter on the clipped start reads every row group again for each chunk of a pass).
GPU_WORK_CATEGORY_CHUNK = _gpu_work("gpu_work", "cat", CATEGORY_LABELS,
                                    " AND device_id = $device AND start_ns >= $raw_lo AND start_ns <= $hi")


def islands(name: str, source: str, keys: str) -> str:
    """A row opens a new island when it starts after every end before it (in start order); a running
    count of openings numbers the islands."""
    return f"""{name}_open AS (
  SELECT {keys}, start_ns, end_ns, coalesce(start_ns > max(end_ns) OVER (
           PARTITION BY {keys} ORDER BY start_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
         true)::INTEGER AS opens
  FROM {source}),
{name}_numbered AS (
  SELECT {keys}, start_ns, end_ns,
         sum(opens) OVER (PARTITION BY {keys} ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
  FROM {name}_open),
{name} AS (
  SELECT {keys}, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM {name}_numbered
  GROUP BY {keys}, island)"""


def pieces(name: str, source: str, keys: str) -> str:
    """In start order, the part of a row past the latest end before it is new covered time."""
    return f"""{name}_from AS (
  SELECT {keys}, greatest(start_ns, coalesce(max(end_ns) OVER (
           PARTITION BY {keys} ORDER BY start_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
         start_ns)) AS start_ns, end_ns
  FROM {source}),
{name} AS (SELECT {keys}, start_ns, end_ns FROM {name}_from WHERE end_ns > start_ns)"""


def gaps(name: str, source: str, keys: str) -> str:
    """A gap runs from the latest end so far (in start order) to the next start, when that is later."""
    return f"""{name}_next AS (
  SELECT {keys}, max(end_ns) OVER w AS reach_ns, lead(start_ns) OVER w AS next_start_ns FROM {source}
  WINDOW w AS (PARTITION BY {keys} ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING)),
{name} AS (
  SELECT {keys}, reach_ns AS start_ns, next_start_ns AS end_ns FROM {name}_next WHERE next_start_ns > reach_ns)"""


def overlaps(name: str, probes: str, events: str, keys: str, payload: str = "") -> str:
    """`keys` and `payload` are comma-separated column lists (payload may be empty)."""
    on = " AND ".join(f"p.{k.strip()} = e.{k.strip()}" for k in keys.split(","))
    cols = "".join(f"e.{c.strip()}, " for c in payload.split(",") if c.strip())
    # One join, so that `events` is read once. A long event's piece is clipped to the bucket, so on the bucket
    # before a probe (there for the short events) it comes out empty and is dropped with the other empty pieces.
    return f"""{name}_joined AS (
  SELECT p.probe_id, {cols}
         greatest(e.start_ns, p.start_ns, CASE WHEN e.spans_buckets THEN p.bucket * $bucket_ns END) AS start_ns,
         least(e.end_ns, p.end_ns, CASE WHEN e.spans_buckets THEN (p.bucket + 1) * $bucket_ns END) AS end_ns
  FROM (SELECT *, unnest(range(start_ns // $bucket_ns - 1, (end_ns - 1) // $bucket_ns + 1)) AS bucket
        FROM {probes}) p
  JOIN (SELECT *, unnest(CASE WHEN spans_buckets THEN range(start_ns // $bucket_ns, (end_ns - 1) // $bucket_ns + 1)
                              ELSE [start_ns // $bucket_ns] END) AS bucket
        FROM (SELECT *, end_ns - start_ns > $bucket_ns AS spans_buckets FROM {events})) e
    ON {on} AND p.bucket = e.bucket),
{name} AS (SELECT * FROM {name}_joined WHERE end_ns > start_ns)"""


BUSY = GPU_WORK + ",\n" + islands("busy", "gpu_work", "device_id")


def covered(name: str, pieces: str) -> str:
    return f"""{name}_reach AS (
  SELECT probe_id, start_ns, end_ns, max(end_ns) OVER (PARTITION BY probe_id ORDER BY start_ns, end_ns
         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_end FROM {pieces}),
{name} AS (
  SELECT probe_id, sum(greatest(0, end_ns - greatest(start_ns, coalesce(before_end, start_ns)))) AS ns
  FROM {name}_reach GROUP BY probe_id)"""
