"""Many small host-to-device copies: how many a step (or a second), and the host time they cost.

Per device, the H2D copies starting in the window with a recorded size of SMALL_UPLOAD_BYTES or less. Their host
time (host_ns): the union of their API calls and of the synchronize call on the same thread that begins within
rules.READBACK_FOLLOW_NS after one returns (a blocking `.to()` is a cudaMemcpyAsync then a cudaStreamSynchronize),
clipped to the window; idle_host_ns is that time less the time the device's kernels run inside it (a sync that
waits for kernels waits for compute, not for the copy). Steps: the iterations step_boundaries finds on the whole
profile for the same devices (those triage finds), each counted by the share of it inside the window; without
any, the rate is per second of the window.
The device's idle the copies cost (copy_idle_ns): the idle attribution's small_copy time, where every small pageable
copy in the window is one of these uploads: the idle inside their calls and the syncs after them, and the host's
turnaround to its next work (up to 1 ms, to an OS call or a claimed activity: not capped at the copy's own time,
short_gaps.UNCAPPED: a copy from host memory is the work), the cost of issuing them one by one.
The finding (excessive-h2d-transfers, tag many-small): many small uploads (MANY_SMALL_PER_STEP a step, or
MANY_SMALL_PER_S a second) whose idle_host_ns is SMALL_HOST_PCT of the window or more; at stake that time or, where
larger, copy_idle_ns, never more than the device idles in the window. memory_transfers gives it the small uploads'
host time before pageable-host-memory: one copy per step removes their calls and syncs, pinned or not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import duckdb
import numpy as np

from stallhound.analysis import cover, rules
from stallhound.analysis.common import Finding, Scope, ms, pct, scope_args
from stallhound.analysis.step_boundaries import boundaries

SMALL_UPLOAD_BYTES = 64 << 10  # 64 KiB moves in 3-10 us over PCIe, about what one copy call costs the host: below
#                                it the fixed cost per copy, not the bytes, sets the time, and fewer copies save it
MANY_SMALL_PER_STEP = 32  # a batch has a few tensors (inputs, labels, masks, offsets); dozens of small uploads a step
#                           are one per sample or per element
MANY_SMALL_PER_S = 1_000  # without steps: a small upload every millisecond or more often
SMALL_HOST_PCT = 5.0  # their host time with no kernel running is a real share of the window (as the book's 5% of
#                       H2D time): less, and copying them at once cannot change the step much
COUNTS_SQL = """
SELECT device_id, count(*), sum(bytes) FROM memcpy
WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end AND direction = 'H2D'
  AND bytes <= $small_bytes GROUP BY ALL
"""
# Each small upload's call, and the sync that follows it on its thread (0-length when none, or none soon enough).
CALLS_SQL = """
WITH small AS (
  SELECT pid, tid, launch_start_ns AS s, launch_end_ns AS e FROM memcpy
  WHERE device_id = $device AND start_ns >= $start AND start_ns < $end AND direction = 'H2D'
    AND bytes <= $small_bytes AND launch_start_ns IS NOT NULL AND tid IS NOT NULL),
syncs AS (
  SELECT a.pid, a.tid, a.start_ns, a.end_ns FROM cuda_api a
  JOIN (SELECT DISTINCT pid, tid FROM small) t ON a.pid = t.pid AND a.tid = t.tid WHERE a.kind = 'sync')
SELECT greatest(s.s, $start) AS s, least(s.e, $end) AS e, greatest(coalesce(y.start_ns, 0), $start) AS ys,
       CASE WHEN y.start_ns - s.e <= $follow THEN least(y.end_ns, $end) ELSE 0 END AS ye
FROM small s ASOF LEFT JOIN syncs y ON y.pid = s.pid AND y.tid = s.tid AND y.start_ns >= s.e
"""
OTHERS_SQL = """
SELECT device_id, count(*) FROM memcpy
WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end AND 'pageable' IN (src_kind,
  dst_kind) AND NOT """ + rules.staged_sql("bytes") + """ AND direction <> 'H2D'
  AND NOT (direction = 'D2H' AND bytes <= $small_read) GROUP BY ALL
"""  # small pageable copies not uploads (small_copy's too, attribution_sql.BLOCKING; small reads are readbacks)
KERNELS_SQL = """
SELECT start_ns AS s, end_ns AS e FROM kernels WHERE device_id = $device AND end_ns > $lo AND start_ns < $hi
"""


@dataclass(frozen=True)
class SmallUploads:
    """One device's small uploads in the window, the steps in it; the host figures only where many() holds."""
    count: int
    bytes: int
    steps: float = 0.0  # iterations in the window (steps_in); 0.0 when none are found
    call_ns: int = 0  # the union of their calls
    host_ns: int = 0  # the union of their calls and the syncs right after them
    idle_host_ns: int = 0  # host_ns while the device runs no kernel
    copy_idle_ns: int = 0  # the device's idle in and after their calls (the attribution's small_copy), else 0
    islands: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # host_ns as intervals


def many(count: int, steps: float, window_ns: int) -> bool:
    """Many small uploads: MANY_SMALL_PER_STEP a step, or without steps MANY_SMALL_PER_S a second."""
    rate = count / steps if steps else count * 1e9 / max(window_ns, 1)
    return count >= MANY_SMALL_PER_STEP and rate >= (MANY_SMALL_PER_STEP if steps else MANY_SMALL_PER_S)


def figures(con: duckdb.DuckDBPyConnection, scope: Scope, whole: Scope,
            small_copy_ns: dict[int, int] | None = None) -> dict[int, SmallUploads]:
    """Per device with many small uploads in scope: them, the steps in scope (found on `whole`, the profile for the
    same devices), their host time, and small_copy_ns (the attribution's, per device) as their copy_idle_ns where no
    other small pageable copy shares it."""
    args = {**scope_args(scope), "small_bytes": SMALL_UPLOAD_BYTES}
    found = {int(d): SmallUploads(int(n), int(b)) for d, n, b in con.execute(COUNTS_SQL, args).fetchall()}
    if all(s.count < MANY_SMALL_PER_STEP for s in found.values()):
        return {}
    steps = steps_in(con, scope, whole)
    others = dict(con.execute(OTHERS_SQL, {**scope_args(scope), "small_read": rules.SMALL_READ_BYTES}).fetchall())
    return {d: _host_time(con, scope, d, replace(s, steps=steps, copy_idle_ns=0 if others.get(d) else (
        small_copy_ns or {}).get(d, 0))) for d, s in found.items() if many(s.count, steps, scope.duration_ns)}


def _host_time(con: duckdb.DuckDBPyConnection, scope: Scope, device: int, found: SmallUploads) -> SmallUploads:
    """found with its host figures: the union of the copies' calls and their syncs (CALLS_SQL), and that union less
    the device's kernels."""
    args = {"start": scope.start_ns, "end": scope.end_ns, "device": device, "small_bytes": SMALL_UPLOAD_BYTES,
            "follow": rules.READBACK_FOLLOW_NS}
    c = con.execute(CALLS_SQL, args).fetchnumpy()
    calls = cover.islands(c["s"].astype(np.int64), c["e"].astype(np.int64))
    starts, ends = cover.islands(np.concatenate((c["s"], c["ys"])).astype(np.int64),
                                 np.concatenate((c["e"], c["ye"])).astype(np.int64))
    host = int((ends - starts).sum())
    if not host:
        return found
    k = con.execute(KERNELS_SQL, {"device": device, "lo": int(starts[0]), "hi": int(ends[-1])}).fetchnumpy()
    busy = int(cover.covered(starts, ends, k["s"].astype(np.int64), k["e"].astype(np.int64)).sum())
    return replace(found, call_ns=int((calls[1] - calls[0]).sum()), host_ns=host, idle_host_ns=host - busy,
                   islands=(starts, ends))


def steps_in(con: duckdb.DuckDBPyConnection, scope: Scope, whole: Scope) -> float:
    """The iterations found on `whole` that lie in scope, each by its share inside it; 0.0 when none are found."""
    spans = boundaries(con, whole, None, "auto")[3]
    return round(sum(max(0, min(e, scope.end_ns) - max(s, scope.start_ns)) / (e - s) for s, e in spans if e > s), 3)


def finding(device: int, small: SmallUploads | None, idle_ns: int, window_ns: int) -> Finding | None:
    """excessive-h2d-transfers (many-small) for one device's small uploads, None where they are few or cheap;
    idle_ns: the device's idle time in the window."""
    stake = min(max(small.idle_host_ns, small.copy_idle_ns), idle_ns) if small else 0
    if small is None or not many(small.count, small.steps, window_ns) or pct(stake, window_ns) < SMALL_HOST_PCT:
        return None
    rate = (f"{small.count / small.steps:,.0f} a step" if small.steps
            else f"{small.count * 1e9 / window_ns:,.0f} a second")
    return Finding(
        root_cause="excessive-h2d-transfers", severity=rules.severity(stake, window_ns),
        title=f"device {device}: {small.count:,} separate host-to-device copies of at most "
              f"{SMALL_UPLOAD_BYTES // 1024} KiB ({rate}, {small.bytes / small.count / 1024:,.1f} KiB on average) "
              f"hold the host {ms(small.host_ns)} in their calls and the syncs right after them"
              + (f"; the device idles {ms(stake)} in them and in the host's turnaround to its next work, the cost of "
                 "issuing them one by one" if small.copy_idle_ns > small.idle_host_ns else "")
              + "; one copy per step would save most of it",
        evidence={"count": small.count, "bytes": small.bytes, "steps": small.steps, "call_ns": small.call_ns,
                  "sync_ns": small.host_ns - small.call_ns, "host_ns": small.host_ns,
                  "host_no_kernel_ns": small.idle_host_ns, "copy_idle_ns": small.copy_idle_ns,
                  "device_idle_ns": idle_ns},
        time_at_stake_ns=stake, device=device, tags=["many-small"])
